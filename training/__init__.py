"""Training: the models the serving layers load (gate, slot reader) and the data they learn from.

Nothing under services/{router,compiler,engine,common} imports this package (pyproject [tool.importlinter]).
"""
