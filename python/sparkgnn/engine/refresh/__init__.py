"""Incremental PE refresh on Spark (job.py: the rounds; partition.py: one partition's piece)."""

from sparkgnn.engine.refresh.job import refresh

__all__ = ["refresh"]
