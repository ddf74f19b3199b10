"""longmoe.train."""
