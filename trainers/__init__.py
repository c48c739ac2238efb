"""Multi-GPU training kit: one distributed runtime shared by several trainers."""

__version__ = "0.1.0"
