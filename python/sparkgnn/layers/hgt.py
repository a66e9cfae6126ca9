"""HGTConv (Hu et al., "Heterogeneous Graph Transformer") as typed-round pieces; matches
torch_geometric.nn.HGTConv (PyG 2.8) in eval. For a destination node i of type T and each head h
(D = F / H channels):

    q_i = Q_T x_i,   k_j = K_s x_j W^k_(r,h),   v_j = V_s x_j W^v_(r,h)   for an edge j -> i of relation r = (s, r, T)
    alpha_ji = softmax over ALL in-edges of i, of every relation, of (q_i . k_j) * p_(r,h) / sqrt(D)
    agg_i = sum_j alpha_ji v_j                                   (heads concatenated: F wide)
    out_i = A_T gelu(agg_i), then with F equal to T's input width: s out_i + (1 - s) x_i, s = sigmoid(skip_T)

WHY per-relation partial states: the softmax normalises over a node's in-edges of every relation at
once, so no relation's output is final on its own. Each relation is an ordinary merge-aware conv
(`HGTRelationLayer`) whose aggregation is the mergeable softmax (running max, sum of exp, weighted
sum per head), but its output is that merged STATE (aggregator `softmax_state`), not the divided
value; the round's cross-relation aggregation `softmax` (layers/hetero.py RelationAggregator) then
merges the relations' states per destination exactly as the homogeneous softmax merges partitions
(rescaling each by exp(its max - the merged max)) and divides. So a relation's in-edges may still
be split over partitions, and the relations computed anywhere and merged in any order. The output
ops (gelu, A_T, the skip gate) read the divided aggregate and the node's own input row; the
relation layer appends that row to its state (`carry`, only when the skip applies), so the type's
output op (`HGTOutputOp`, a node op in the round's post ops) needs nothing but the merged row.

A relation's conv reads one width on both sides (the typed rounds ship both types' rows in one
column), so HGT's per-type input widths must agree within each relation (a per-type Linear first,
as PyG's HGT examples do). The relation's key, query and value maps are its source type's and its
destination type's slices of HGT's kqv_lin, and p_rel, k_rel, v_rel its relation's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import NODE_OPS, NodeOp


@register_conv("hgt_relation")
class HGTRelationLayer(MergeableConv):
    """One relation of an HGT round (module doc). Output per destination: [max logit (H) | sum
    exp (H) | weighted value sum (F) | the destination's input row (in_dim, when channels ==
    in_dim: HGT's skip then applies)], to be merged across relations, then divided."""

    # update reads h_dst[i] and agg[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(self, in_dim: int, channels: int, heads: int = 1):
        super().__init__()
        self.in_dim, self.channels, self.heads = int(in_dim), int(channels), int(heads)
        if min(self.in_dim, self.channels, self.heads) < 1:
            raise ValueError(
                f"hgt_relation: in_dim, channels and heads must be >= 1, got {in_dim}, {channels}, {heads}"
            )
        if self.channels % self.heads:
            raise ValueError(f"hgt_relation: channels ({channels}) must be divisible by heads ({heads})")
        f, d = self.channels, self.channels // self.heads
        self.carry = self.in_dim if self.channels == self.in_dim else 0
        self.out_dim = 2 * self.heads + f + self.carry
        self.weight_key = torch.nn.Parameter(torch.zeros(f, self.in_dim))
        self.bias_key = torch.nn.Parameter(torch.zeros(f))
        self.weight_query = torch.nn.Parameter(torch.zeros(f, self.in_dim))
        self.bias_query = torch.nn.Parameter(torch.zeros(f))
        self.weight_value = torch.nn.Parameter(torch.zeros(f, self.in_dim))
        self.bias_value = torch.nn.Parameter(torch.zeros(f))
        self.k_rel = torch.nn.Parameter(torch.zeros(self.heads, d, d))  # per head: k @ k_rel[h]
        self.v_rel = torch.nn.Parameter(torch.zeros(self.heads, d, d))
        self.p_rel = torch.nn.Parameter(torch.ones(self.heads))
        self.aggregator = get_aggregator("softmax_state", heads=self.heads)
        self.needs_dst_in_message = True
        self.can_pre_transform = True

    def config(self) -> dict:
        return {"kind": self.kind, "in_dim": self.in_dim, "channels": self.channels, "heads": self.heads}

    def src_width(self, pre_transform: bool) -> int:
        return 2 * self.channels if self._pre(pre_transform) else self.in_dim

    def dst_width(self) -> int:
        return self.channels

    def msg_width(self, pre_transform: bool) -> int:
        return self.heads + self.channels

    def _per_head(self, x: Tensor, rel: Tensor) -> Tensor:
        """x [N, F] through each head's relation matrix (PyG's HeteroLinear: x_h @ W[h])."""
        n, d = x.shape[0], self.channels // self.heads
        return torch.einsum("nhd,hde->nhe", x.view(n, self.heads, d), rel).reshape(n, self.channels)

    def _key_value(self, h: Tensor) -> Tensor:
        k = self._per_head(F.linear(h, self.weight_key, self.bias_key), self.k_rel)
        v = self._per_head(F.linear(h, self.weight_value, self.bias_value), self.v_rel)
        return torch.cat([k, v], dim=1)

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return self._key_value(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return F.linear(h, self.weight_query, self.bias_query)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("hgt_relation: the message needs the destination payload (the query)")
        kv = src_e if self._pre(pre_transform) else self._key_value(src_e)
        e, f, d = kv.shape[0], self.channels, self.channels // self.heads
        key = kv[:, :f].view(e, self.heads, d)
        logit = (dst_e.view(e, self.heads, d) * key).sum(dim=-1) * self.p_rel.view(1, -1)
        logit = logit / math.sqrt(d)  # PyG's order: the dot product times p_rel, then / sqrt(D)
        return torch.cat([logit, kv[:, f:]], dim=1)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return torch.cat([agg, h_dst], dim=1) if self.carry else agg


@NODE_OPS.register("hgt_output")
class HGTOutputOp(NodeOp):
    """HGT's per-type output (module doc) on a merged, divided row [agg (F) | x (carry)]:
    A_T gelu(agg), gated with the node's input row x by sigmoid(skip) when it carries one."""

    op = "hgt_output"
    row_wise = True

    def __init__(self, channels: int, carry: int = 0):
        super().__init__()
        self.channels, self.carry = int(channels), int(carry)
        if self.channels < 1 or self.carry not in (0, self.channels):
            raise ValueError(f"hgt_output: channels must be >= 1 and carry 0 or channels, got {channels}, {carry}")
        self.weight = torch.nn.Parameter(torch.zeros(self.channels, self.channels))
        self.bias = torch.nn.Parameter(torch.zeros(self.channels))
        self.skip = torch.nn.Parameter(torch.ones(1)) if self.carry else None

    def config(self) -> dict:
        return {"op": self.op, "channels": self.channels, "carry": self.carry}

    def out_dim(self, in_dim: int) -> int:
        if in_dim != self.channels + self.carry:
            raise ValueError(f"hgt_output expects width {self.channels + self.carry}, got {in_dim}")
        return self.channels

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(F.gelu(x[:, : self.channels]), self.weight, self.bias)
        if self.skip is None:
            return out
        alpha = self.skip.sigmoid()
        return alpha * out + (1 - alpha) * x[:, self.channels :]


__all__ = ["HGTOutputOp", "HGTRelationLayer"]
