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
  "remove"    : torch_geometric.utils.remove_self_loops (ChebConv's get_laplacian): every
                existing self loop dropped, none added.
  "replace"   : remove_self_loops + add_self_loops (GATConv): drop all existing self loops, add
                one per node. Weights (unused by GAT) of the new loops are 1.
  "replace_mean": "replace" for a conv that reads edge attributes ([E, D] rows in the weight slot,
                GATConv / GATv2Conv with edge_dim and PyG's default fill_value="mean"): each new
                loop's attributes are the mean of the node's remaining in-edges' attributes (0
                without any), what add_self_loops(fill_value="mean") computes. It reads every
                in-edge of the node, so it is exact wherever a node's in-edges are together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
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


@_policy("remove")
def _remove(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    keep = src != dst
    return src[keep], dst[keep], None if weight is None else weight[keep]


@_policy("replace")
def _replace(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype, device=src.device)
    new_weight = None
    if weight is not None:
        fill = torch.ones((num_nodes,) + tuple(weight.shape[1:]), dtype=weight.dtype, device=weight.device)
        new_weight = torch.cat([weight[keep], fill])
    return (torch.cat([src[keep], loops]), torch.cat([dst[keep], loops]), new_weight)


@_policy("replace_mean")
def _replace_mean(src: Tensor, dst: Tensor, weight: Tensor | None, num_nodes: int) -> EdgeList:
    keep = src != dst
    loops = torch.arange(num_nodes, dtype=src.dtype, device=src.device)
    new_weight = None
    if weight is not None:
        kept, to = weight[keep], dst[keep]
        sums = torch.zeros((num_nodes,) + tuple(weight.shape[1:]), dtype=weight.dtype, device=weight.device)
        sums.index_add_(0, to, kept)
        count = torch.zeros(num_nodes, dtype=weight.dtype, device=weight.device)
        count.index_add_(0, to, torch.ones(to.numel(), dtype=weight.dtype, device=weight.device))
        fill = sums / count.clamp(min=1).view((-1,) + (1,) * (weight.dim() - 1))
        new_weight = torch.cat([kept, fill])
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
        if weight.dim() == 0 or weight.shape[0] != src.shape[0]:
            raise ValueError("weight (or edge_attr) must have one entry (row) per edge")
    return fn(src, dst, weight, int(num_nodes))


def apply_policy_to_targets(
    src: np.ndarray,
    dst_pos: np.ndarray,
    weight: np.ndarray | None,
    targets: np.ndarray,
    policy: str,
    *,
    positions: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    unique_inverse: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Apply `policy` to the in-edges of a few `targets` (distinct vertex ids, any order) exactly
    as it acts on the whole graph. Edges: source ids `src`, destination POSITIONS in `targets`
    (`dst_pos`, 0..T-1), weights or None. Returns (source ids, destination positions, weights or
    None): the kept edges in input order, then the policy's loops of targets 0..T-1.

    WHY this is exact and why the local numbering: a policy only drops or adds loops of the
    destinations, and a destination's loops are among its in-edges, so the in-edges of the targets
    suffice. But a policy adds exactly one loop to EVERY vertex 0..num_nodes-1, so it runs on a
    local numbering: targets 0..T-1 (num_nodes = T: one loop per target, from its existing loops
    when the policy keeps their weight), other sources T.. (never looped: a source that is not a
    target must not gain a loop, and none of its edges here is a loop, so none is dropped). The
    result is mapped back to the caller's ids.

    `positions(keys, values)` (index of each value in the distinct `keys`, -1 when absent) and
    `unique_inverse(values)` (sorted distinct values, position of each value in them) default to
    numpy; a caller with faster set operations (serving's NodeSets) passes its own.
    """
    if policy == "none":
        return src, dst_pos, weight
    positions = positions or _positions
    unique_inverse = unique_inverse or _unique_inverse
    t = len(targets)
    local = positions(targets, src)
    is_t = local >= 0
    others, other_pos = unique_inverse(src[~is_t])
    local[~is_t] = t + other_pos
    s, d, w2 = apply_self_loops(
        torch.from_numpy(local),
        torch.from_numpy(dst_pos),
        None if weight is None else torch.from_numpy(weight),
        t,
        policy,
    )
    back = np.concatenate([targets, others])
    return back[s.numpy()], d.numpy(), None if w2 is None else w2.numpy()


def _positions(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each value its index in the distinct `keys` (any order), -1 when absent."""
    out = np.full(len(values), -1, np.int64)
    if not len(keys):
        return out
    order = np.argsort(keys, kind="stable")
    at = np.minimum(np.searchsorted(keys, values, sorter=order), len(keys) - 1)
    found = keys[order[at]] == values
    out[found] = order[at[found]]
    return out


def _unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, position of each value in them)."""
    return np.unique(values, return_inverse=True)
