"""Flywheel core: the records, settings, storage, tracking and inference shared by every recipe."""
