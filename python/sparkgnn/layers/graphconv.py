"""GraphConv (Morris et al., "Weisfeiler and Leman go neural") as a mergeable layer; matches
torch_geometric.nn.GraphConv in eval:

    out_i = lin_rel(aggr_{j->i} e_ji * x_j) + lin_root(x_i)

with e_ji the edge weight (1 without weights), no self loops added, and aggr any one-pass
aggregator of the registry that reduces plain messages (sum, mean, max, min, var, std, power
mean; models/pyg_convs.py maps PyG's aggregation to it).

The message is the source row scaled by its edge weight, so it needs no destination payload;
lin_rel's bias and the root term depend on the destination alone and live in `update`.
WHY pre-transform is conditional: lin_rel commutes with the aggregation only when the aggregation
is linear (sum, mean): e.g. max_j (e_ji x_j W) differs from (max_j e_ji x_j) W, so the other
aggregations always ship raw rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv


@register_conv("graphconv")
class GraphConvLayer(MergeableConv):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        aggr: str = "sum",
        aggr_options: dict | None = None,
        bias: bool = True,
        use_edge_weight: bool = True,
    ):
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.aggr, self.aggr_options = str(aggr), dict(aggr_options or {})
        self.aggregator = get_aggregator(self.aggr, **self.aggr_options)
        if self.aggregator.phases != 1 or self.aggregator.out_width(1) != 1:
            raise ValueError(f"graphconv: aggregator {self.aggr!r} does not reduce each message column to one value")
        self.uses_edge_weight = bool(use_edge_weight)
        self.can_pre_transform = self.aggregator.linear
        self.weight_rel = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim))
        self.bias_rel = torch.nn.Parameter(torch.zeros(self.out_dim)) if bias else None
        self.weight_root = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim))

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "aggr": self.aggr,
            "aggr_options": self.aggr_options,
            "bias": self.bias_rel is not None,
            "use_edge_weight": self.uses_edge_weight,
        }

    def src_width(self, pre_transform: bool) -> int:
        return self.out_dim if self._pre(pre_transform) else self.in_dim

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return F.linear(h, self.weight_rel) if self._pre(pre_transform) else h

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if weight_e is None or not self.uses_edge_weight:
            return src_e
        return src_e * weight_e.to(src_e.dtype).unsqueeze(-1)

    def message_scale(self, weight_e: Tensor | None, pre_transform: bool):
        if weight_e is None or not self.uses_edge_weight:
            return True, None
        return True, weight_e.to(torch.float32)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        out = agg if self._pre(pre_transform) else F.linear(agg, self.weight_rel)
        if self.bias_rel is not None:
            out = out + self.bias_rel
        return out + F.linear(h_dst, self.weight_root)
