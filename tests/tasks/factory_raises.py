def build(params):
    raise ValueError("no data at /nonexistent/path")
