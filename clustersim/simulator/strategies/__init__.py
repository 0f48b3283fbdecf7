"""Training strategies: each turns (model, cluster, settings) into the Program of one iteration.

One module per optimizer; the engine never imports them. See ``registry`` for the list.
"""
