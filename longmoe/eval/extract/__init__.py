"""Structured extraction: image -> JSON fields on held-out rendered documents (``longmoe eval extract``)."""
