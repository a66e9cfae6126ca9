"""Spark executor: runs a planner Plan on DataFrames. The only package (with spark_jobs/) that
imports pyspark."""
