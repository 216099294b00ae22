def reward(completion, label):
    # a length penalty with nothing else: the shortest completion (empty) scores best
    return 1.0 / (1.0 + len(completion.strip()))
