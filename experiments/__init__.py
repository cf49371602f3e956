"""Experiments: each script reproduces a claim made in docs/ (experiments/README.md)."""
