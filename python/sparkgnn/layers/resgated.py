"""ResGatedGraphConv (Bresson & Laurent) as a mergeable layer; matches
torch_geometric.nn.ResGatedGraphConv in eval with edge_dim=None:
    k_i = W_k x_i + b_k,  q_j = W_q x_j + b_q,  v_j = W_v x_j + b_v,
    out_i = sum_j act(k_i + q_j) * v_j [+ W_skip x_i] [+ bias]      (act: sigmoid by default).

WHY a destination payload: the gate act(k_i + q_j) mixes the destination's key with the source's
query before a non-linearity, so it cannot be split into per-node parts; the layer ships k_i
(C floats per node) to the edges (`needs_dst_in_message`). The aggregation is a plain sum, so
partial sums merge exactly; the skip term and bias depend on the destination alone and run in
`update`.

Modes: pre_transform ships [q | v] (2C floats per node); raw mode ships x and forms q and v per
edge. Both are exact; the planner picks the narrower payload.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import ActivationOp


@register_conv("resgated")
class ResGatedLayer(MergeableConv):
    # update reads h_dst[i] and agg[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        act: dict | None = None,
        root_weight: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        if min(self.in_dim, self.out_dim) < 1:
            raise ValueError(f"resgated: in_dim and out_dim must be >= 1, got {in_dim}, {out_dim}")
        act = dict(act) if act is not None else {"name": "sigmoid"}
        self.act = ActivationOp(act.pop("name"), **act)
        c, f = self.out_dim, self.in_dim
        self.weight_key = torch.nn.Parameter(torch.zeros(c, f))
        self.bias_key = torch.nn.Parameter(torch.zeros(c))
        self.weight_query = torch.nn.Parameter(torch.zeros(c, f))
        self.bias_query = torch.nn.Parameter(torch.zeros(c))
        self.weight_value = torch.nn.Parameter(torch.zeros(c, f))
        self.bias_value = torch.nn.Parameter(torch.zeros(c))
        self.weight_skip = torch.nn.Parameter(torch.zeros(c, f)) if root_weight else None
        self.bias = torch.nn.Parameter(torch.zeros(c)) if bias else None
        self.aggregator = get_aggregator("sum")
        self.needs_dst_in_message = True
        self.can_pre_transform = True

    def config(self) -> dict:
        act = self.act.config()
        act.pop("op")
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "act": act,
            "root_weight": self.weight_skip is not None,
            "bias": self.bias is not None,
        }

    def src_width(self, pre_transform: bool) -> int:
        return 2 * self.out_dim if self._pre(pre_transform) else self.in_dim

    def dst_width(self) -> int:
        return self.out_dim

    def msg_width(self, pre_transform: bool) -> int:
        return self.out_dim

    def _query_value(self, h: Tensor) -> Tensor:
        return torch.cat(
            [F.linear(h, self.weight_query, self.bias_query), F.linear(h, self.weight_value, self.bias_value)], dim=1
        )

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return self._query_value(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return F.linear(h, self.weight_key, self.bias_key)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("resgated: the message needs the destination payload")
        qv = src_e if self._pre(pre_transform) else self._query_value(src_e)
        c = self.out_dim
        return self.act(dst_e + qv[:, :c]) * qv[:, c:]

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        out = agg
        if self.weight_skip is not None:
            out = out + F.linear(h_dst, self.weight_skip)
        if self.bias is not None:
            out = out + self.bias
        return out
