"""Benchmarks and measurements: scripts run as `python -m bench.<name>` (README, Makefile)."""
