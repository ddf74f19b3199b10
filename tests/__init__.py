"""longmoe's tests: a package, so every test imports its helpers as ``tests.helpers.<module>``."""
