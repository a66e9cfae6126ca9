"""Planner: compiles a trained model's layers + graph statistics + a task into an operator plan.

Pure Python (no torch, no pyspark: the design's dependency rule, so the planner can run on a
driver, in a notebook or in the bench without either). Modules, one job each:
  errors      PlanError, the planner's own error base (it imports nothing else of sparkgnn)
  inputs      check and normalise the plain-dict inputs (PlanError naming the fault)
  ir          Operator / LayerPlan / Plan, JSON round trip
  segments    row sizes and Pipe round-trip building blocks
  strategies  registry of physical data-movement strategies, with edge_join and replicate
  combine     partial states at the source partitions, merged at the destination's owner
  pushdown    the fourth strategy: message + aggregation in Spark (the JVM module's native aggregates)
  rewrites    transform-then-propagate, fusion of DL operators into one Pipe round trip
  cost        CostModel (calibrated constants) and measuring an operator list
  partitions  choose_layout / choose_partitions (P = cores and all cores at once, unless memory needs otherwise)
  compile     compile(layers, graph_stats, task) -> Plan
  explain     Plan.explain() text
  pruning     requested ids through their k-hop frontier: local / pruned subgraph / whole graph, priced
"""

from sparkgnn.planner import combine as _combine  # noqa: F401 (registers the combine strategy)
from sparkgnn.planner import pushdown as _pushdown  # noqa: F401 (registers the pushdown strategy)
from sparkgnn.planner.compile import compile
from sparkgnn.planner.cost import CostModel, Estimate, measure
from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.ir import ENGINES, OPERATORS, LayerPlan, Operator, Plan
from sparkgnn.planner.partitions import MEMORY_MARGIN, choose_layout, choose_partitions, task_memory_bytes
from sparkgnn.planner.strategies import STRATEGIES

__all__ = [
    "compile",
    "choose_layout",
    "choose_partitions",
    "Plan",
    "LayerPlan",
    "Operator",
    "CostModel",
    "Estimate",
    "measure",
    "STRATEGIES",
    "OPERATORS",
    "ENGINES",
    "MEMORY_MARGIN",
    "task_memory_bytes",
    "PlanError",
]
