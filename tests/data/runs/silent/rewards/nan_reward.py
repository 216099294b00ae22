def reward(completion, label):
    # a parser that returns NaN as its "no answer" value when the completion holds no integer
    try:
        return float(int(completion.strip()) == int(label.strip()))
    except ValueError:
        return float("nan")
