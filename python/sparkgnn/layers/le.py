"""LEConv (Ranjan et al., ASAP's "local extremum" conv) as a mergeable layer; matches
torch_geometric.nn.LEConv in eval:
    a_j = W_1 x_j + b_1,  b_i = W_2 x_i,
    out_i = sum_j e_ji (a_j - b_i) + W_3 x_i + b_3       (e_ji the edge weight, 1 without weights).

WHY the destination term stays inside the message: the sum could be rewritten as
sum_j e_ji a_j - deg_w(i) b_i with a weighted in-degree statistic, but that subtracts two large
sums where PyG subtracts per edge, and the engine's node rows carry no weighted in-degree column.
Shipping b_i (C floats per node) to the edges instead (`needs_dst_in_message`, as GAT does)
forms every message exactly as PyG does, e_ji (a_j - b_i), for any edge weights, self loops (kept
as given: LEConv adds none) and parallel edges (each one a term of the sum). The aggregation is a
plain sum, so partial sums merge exactly; W_3 x_i + b_3 runs in `update`.

Modes: pre_transform ships a = W_1 x + b_1 (C floats per node); raw mode ships x and applies W_1
per edge. Both are exact; the planner picks the narrower payload.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv


@register_conv("le")
class LELayer(MergeableConv):
    # update reads h_dst[i] and agg[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, use_edge_weight: bool = True):
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        if min(self.in_dim, self.out_dim) < 1:
            raise ValueError(f"le: in_dim and out_dim must be >= 1, got {in_dim}, {out_dim}")
        c, f = self.out_dim, self.in_dim
        self.weight_1 = torch.nn.Parameter(torch.zeros(c, f))
        self.bias_1 = torch.nn.Parameter(torch.zeros(c)) if bias else None
        self.weight_2 = torch.nn.Parameter(torch.zeros(c, f))
        self.weight_3 = torch.nn.Parameter(torch.zeros(c, f))
        self.bias_3 = torch.nn.Parameter(torch.zeros(c)) if bias else None
        self.uses_edge_weight = bool(use_edge_weight)
        self.aggregator = get_aggregator("sum")
        self.needs_dst_in_message = True
        self.can_pre_transform = True

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "bias": self.bias_1 is not None,
            "use_edge_weight": self.uses_edge_weight,
        }

    def src_width(self, pre_transform: bool) -> int:
        return self.out_dim if self._pre(pre_transform) else self.in_dim

    def dst_width(self) -> int:
        return self.out_dim

    def _lin_1(self, h: Tensor) -> Tensor:
        return F.linear(h, self.weight_1, self.bias_1)

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return self._lin_1(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return F.linear(h, self.weight_2)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("le: the message needs the destination payload")
        out = (src_e if self._pre(pre_transform) else self._lin_1(src_e)) - dst_e
        if weight_e is None or not self.uses_edge_weight:
            return out
        return out * weight_e.to(out.dtype).view(-1, 1)

    def msg_width(self, pre_transform: bool) -> int:
        return self.out_dim

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return agg + F.linear(h_dst, self.weight_3, self.bias_3)
