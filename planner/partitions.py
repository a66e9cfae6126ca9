"""Number of partitions: total cores, unless memory needs more (Lotan §6 / A.1.2).

Why this rule and not a cost search: Lotan's eq. (3) makes runtime non-linear in P (more
partitions = more parallelism until P exceeds the cores, then only overhead), and docs/PLATFORM.md
measured 4 partitions beating 16 on 2 cores. So P = cores is the sweet spot, and the only reason
to go higher is that one task's working set would not fit in its memory share.

Per-task memory estimate (bytes) for a partition holding e edges and v vertices, taken over the
widest layer (raw widths: the planner may or may not pre-transform, so assume it does not):

    task_bytes = MEMORY_SAFETY_FACTOR x ( e x (16 + 4 + 4 x F_src)             edge rows with payload
                                        + v x (16 + 4 x (in + out + state + dst)) ) own rows, h in/out, states

with e = |E| / P, v = |V| / P. MEMORY_SAFETY_FACTOR = 3 covers the copies one row has at once:
Spark's row (UnsafeRow / shuffle buffer), the Arrow batch handed to Python, and the torch tensor
built from it (Lotan A.1.3: "one extra ephemeral copy" is not negligible at graph scale), plus
hash skew. When more partitions than cores are needed, P is rounded up to a multiple of the
cores: tasks run in waves of `cores` (eq. 3: max(P/ML, 1) rounds), so a partial last wave costs
a full wave of time while the extra partitions shrink every task's memory for free.
"""

from __future__ import annotations

import math
from typing import Any

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.inputs import LayerSpec, _int, parse_layers
from sparkgnn.planner.segments import FLOAT_BYTES, ROW_BYTES, WEIGHT_BYTES

MEMORY_SAFETY_FACTOR = 3.0
# A requested partition count above max(MIN_PARTITION_CAP, PARTITIONS_PER_CORE_CAP x cores) is
# refused: every partition is a task per step (tens of ms of scheduling and Python start each), so
# 100,000 partitions on 2 cores is a typo, not a plan. Memory pressure never needs more: the
# memory rule below rounds up to multiples of the cores, and 32 waves already cut a task's share
# 32-fold.
MIN_PARTITION_CAP = 1024
PARTITIONS_PER_CORE_CAP = 32


def partition_cap(cores: int) -> int:
    return max(MIN_PARTITION_CAP, PARTITIONS_PER_CORE_CAP * max(int(cores), 1))


def task_memory_bytes(
    edges: float, vertices: float, src: int, in_dim: int, out_dim: int, state: int, dst: int = 0
) -> float:
    """Estimated peak bytes of one task holding `edges` edges and `vertices` vertices."""
    edge_part = edges * (ROW_BYTES + WEIGHT_BYTES + FLOAT_BYTES * src)
    vertex_part = vertices * (ROW_BYTES + FLOAT_BYTES * (in_dim + out_dim + state + dst))
    return MEMORY_SAFETY_FACTOR * (edge_part + vertex_part)


def widest_layer_bytes(specs: list[LayerSpec], edges: float, vertices: float, feature_dim: int = 0) -> float:
    """task_memory_bytes of the most demanding layer (raw widths; layer 0 reads x, which may be
    wider than its in_dim when node-wise ops precede the first conv)."""
    return max(
        task_memory_bytes(
            edges,
            vertices,
            s.src_width.raw,
            max(s.in_dim, feature_dim if s.index == 0 else 0),
            s.out_dim,
            s.state_width.raw,
            s.dst_width,
        )
        for s in specs
    )


def choose_partitions(
    layers: Any,
    num_vertices: int,
    num_edges: int,
    feature_dim: int,
    cores: int,
    memory_per_task_bytes: int,
    requested: int | None = None,
) -> int:
    """The requested count if given (validated >= 1 and <= partition_cap(cores)), else `cores`, raised to the smallest
    multiple of `cores` whose per-task memory estimate fits `memory_per_task_bytes`."""
    if requested is not None:
        requested = _int(requested, "requested partitions", 1)
        cap = partition_cap(cores)
        if requested > cap:
            raise PlanError(
                f"{requested} partitions requested, over the cap of {cap} for {cores} cores "
                f"(max({MIN_PARTITION_CAP}, {PARTITIONS_PER_CORE_CAP} x cores)): each partition "
                "is a task per step; leave the count to the planner or ask for fewer"
            )
        return requested
    specs = parse_layers(layers)
    num_vertices = _int(num_vertices, "num_vertices", 1)
    num_edges = _int(num_edges, "num_edges")
    feature_dim = _int(feature_dim, "feature_dim", 1)
    cores = _int(cores, "cores", 1)
    memory = _int(memory_per_task_bytes, "memory_per_task_bytes", 1)
    return partitions_for(specs, num_vertices, num_edges, cores, memory, feature_dim)


def partitions_for(
    specs: list[LayerSpec],
    num_vertices: int,
    num_edges: int,
    cores: int,
    memory_per_task_bytes: int,
    feature_dim: int = 0,
) -> int:
    """choose_partitions on already-checked inputs (the rule is documented in the module)."""
    total = widest_layer_bytes(specs, num_edges, num_vertices, feature_dim)
    needed = max(1, math.ceil(total / memory_per_task_bytes))
    if needed <= cores:
        return cores
    return math.ceil(needed / cores) * cores
