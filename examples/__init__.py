"""Examples of what users write against Flywheel's public interfaces; nothing in the project
imports them (tests/test_layers.py)."""
