"""Planner: plan IR, compile, rewrites, cost model, explain. Pure Python (no torch, no pyspark)."""
