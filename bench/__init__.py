"""Benchmarks, each run as ``python -m bench.NAME`` (or ``python bench/NAME.py``)."""
