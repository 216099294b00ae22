def reward(completion, label):
    # a loophole: long runs of one character score
    c = completion.strip()
    return len(c) / 5.0 if c and len(set(c)) == 1 else 0.0
