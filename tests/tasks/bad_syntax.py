def build(params)
    return None
