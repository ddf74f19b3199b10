"""longmoe.distributed."""
