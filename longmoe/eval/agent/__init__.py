"""Agent evaluation: episode success by horizon on the tool environments (``longmoe eval agent``)."""
