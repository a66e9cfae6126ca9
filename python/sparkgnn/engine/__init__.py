"""Spark executor: runs a planner Plan on DataFrames. The only package (with spark_jobs/) that
imports pyspark."""

from sparkgnn.engine.api import infer, plan_for
from sparkgnn.engine.precompute import precompute

__all__ = ["infer", "plan_for", "precompute"]
