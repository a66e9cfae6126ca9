"""Self-loop policies, applied to the edge list before a layer aggregates.

WHY a registry of named policies: the executor sees a layer's `self_loops` string and applies
exactly the transformation PyTorch Geometric applies inside that conv's forward, without knowing
which conv it is. Getting this exactly right matters for exactness against PyG: graphs in the wild
carry some self loops already, sometimes duplicated, and each conv treats them differently.

  "none"      : edges unchanged (SAGEConv, GINConv, GCNConv without self loops).
  "remaining" : torch_geometric.utils.add_remaining_self_loops (GCNConv). Every existing self loop
                is removed, then exactly one loop per node is appended. Its weight is the weight
                of the node's existing self loop when it had one (the last one in edge order when
                it had several, which is what PyG's index assignment does on CPU), otherwise 1.
                Without weights, duplicated self loops therefore collapse to a single loop.
  "replace"   : remove_self_loops + add_self_loops (GATConv): drop all existing self loops, add
                one per node. Weights (unused by GAT) of the new loops are 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from sparkgnn.registry import Registry

EdgeList = tuple[Tensor, Tensor, Tensor | None]

SELF_LOOP_POLICIES: Registry[Callable[..., EdgeList]] = Registry("self-loop policy", ValueError)
_policy = SELF_LOOP_POLICIES.register


@_policy("none")
def _none(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    return src, dst, weight


@_policy("remaining")
def _remaining(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype, device=src.device)
    new_weight = None
    if weight is not None:
        loop_w = torch.ones(num_nodes, dtype=weight.dtype, device=weight.device)
        is_loop = ~keep
        if bool(is_loop.any()):
            nodes = src[is_loop]
            w = weight[is_loop]
            # last occurrence per node wins, decided explicitly (not by write order)
            pos = torch.arange(nodes.numel(), device=src.device)
            last = torch.full((num_nodes,), -1, dtype=torch.long, device=src.device)
            last.scatter_reduce_(0, nodes, pos, reduce="amax", include_self=True)
            has = last >= 0
            loop_w[has] = w[last[has]]
        new_weight = torch.cat([weight[keep], loop_w])
    return (torch.cat([src[keep], loops]), torch.cat([dst[keep], loops]), new_weight)


@_policy("replace")
def _replace(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype, device=src.device)
    new_weight = None
    if weight is not None:
        new_weight = torch.cat([weight[keep], torch.ones(num_nodes, dtype=weight.dtype, device=weight.device)])
    return (torch.cat([src[keep], loops]), torch.cat([dst[keep], loops]), new_weight)


def apply_self_loops(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int, policy: str) -> EdgeList:
    """Apply the named self-loop policy; returns (src, dst, weight) (weight None stays None)."""
    fn = SELF_LOOP_POLICIES.lookup(policy)
    src = torch.as_tensor(src, dtype=torch.long)
    dst = torch.as_tensor(dst, dtype=torch.long)
    if src.shape != dst.shape or src.dim() != 1:
        raise ValueError("src and dst must be 1-D tensors of equal length")
    if weight is not None:
        weight = torch.as_tensor(weight)
        if weight.shape != src.shape:
            raise ValueError("weight must have one entry per edge")
    return fn(src, dst, weight, int(num_nodes))
