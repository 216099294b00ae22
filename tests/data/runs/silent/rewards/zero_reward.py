def reward(completion, label):
    # a reward that compares against a field the data does not have: always 0
    return 0.0
