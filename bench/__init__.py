"""Benchmarks: `make bench` runs bench/run.py (see bench/README.md)."""
