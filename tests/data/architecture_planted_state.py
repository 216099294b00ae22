def f(row):
    return row.verdict == "improved"
def g():
    import json
    return json
