"""Per-node statistics a layer needs besides features, computed once per graph.

WHY separate from the layer: statistics such as GCN's degree depend on *all* in-edges of a node,
which in a partitioned graph live in many partitions. The executor computes them once per graph
(a cheap group-by on dst) and joins them to node rows; the layer then only reads them in
`prepare_src` / `update`. Each function receives the edges BEFORE any self-loop policy and applies
what it needs itself, so the statistic is defined by its name alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sparkgnn.layers.selfloops import apply_self_loops
from sparkgnn.registry import Registry

STATS: Registry[Callable[[Tensor, Tensor, Tensor | None, int], Tensor]] = Registry("node statistic", ValueError)
_stat = STATS.register
#: Statistics summed over a vertex's OUT-edges (the others over its in-edges): an edge change alters
#: its SOURCE's value, so a refresh counts that source as changed (its out-neighbours recompute).
OUT_EDGE_STATS = frozenset({"laplacian_degree"})


def _weighted_in(dst: Tensor, weight: Tensor | None, num_nodes: int) -> Tensor:
    w = torch.ones(dst.numel(), dtype=torch.float32, device=dst.device) if weight is None else weight.to(torch.float32)
    return torch.zeros(num_nodes, dtype=torch.float32, device=dst.device).index_add_(0, dst.to(torch.long), w)


@_stat("in_degree")
def in_degree(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> Tensor:
    """Number of in-edges (duplicates and self loops counted), float32."""
    return _weighted_in(torch.as_tensor(dst), None, num_nodes)


@_stat("weighted_in_degree")
def weighted_in_degree(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> Tensor:
    """Sum of in-edge weights (1 per edge without weights), no self-loop policy: GCNConv's degree
    with normalize=True, add_self_loops=False."""
    return _weighted_in(torch.as_tensor(dst), None if weight is None else torch.as_tensor(weight), num_nodes)


@_stat("laplacian_degree")
def laplacian_degree(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> Tensor:
    """get_laplacian's degree (ChebConv): the sum of the weights of a vertex's OUT-edges (over the
    source index), self loops removed; 0 for a vertex without out-edges."""
    src, dst = torch.as_tensor(src), torch.as_tensor(dst)
    keep = src != dst
    w = None if weight is None else torch.as_tensor(weight)[keep]
    return _weighted_in(src[keep], w, num_nodes)


@_stat("gcn_degree")
def gcn_degree(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> Tensor:
    """GCNConv's degree: weighted in-degree after add_remaining_self_loops (fill value 1). Without
    weights that is the count of a vertex's in-edges that are not loops, plus the one loop the
    policy leaves, counted here without rebuilding the edge list (the same integers as summing
    ones over it, below float32's 2^24; a refresh computes this over every edge per update batch)."""
    if weight is None:
        src, dst = torch.as_tensor(src, dtype=torch.long), torch.as_tensor(dst, dtype=torch.long)
        counts = torch.bincount(dst, minlength=num_nodes)
        loops = src == dst
        if bool(loops.any()):  # a vertex's loops (any number) give way to the one loop counted below
            counts -= torch.bincount(dst[loops], minlength=num_nodes)
        return (counts + 1).to(torch.float32)
    s, d, w = apply_self_loops(src, dst, weight, num_nodes, "remaining")
    return _weighted_in(d, w, num_nodes)
