"""Long-context evaluation: the task grid (task x length x depth) and loss by position
(``longmoe eval longctx``)."""
