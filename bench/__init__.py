"""Benchmarks and fault scenarios that print comparable figures (`python -m bench.NAME`)."""
