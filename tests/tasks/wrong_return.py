def build(params):
    return {"model": None}
