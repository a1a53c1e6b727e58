"""Benchmarks of the shim's per-call overhead (``python -m bench.shim``)."""
