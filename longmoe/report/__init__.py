"""Reporting: everything that reads result JSON and writes what people read (``card.py``: ``longmoe
report``; ``headlines.py``: the headline numbers; ``rules.py``: a headline and its rules;
``provenance.py``: where a result came from; ``plotting.py``: matplotlib set up once). Importing the
package imports none of them, so the report card stays free of torch (an import-linter contract)."""
