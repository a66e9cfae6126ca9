"""EdgeConv (Wang et al., "Dynamic Graph CNN") as a mergeable layer; matches
torch_geometric.nn.EdgeConv in eval:

    out_i = aggr_{j->i} nn([x_i | x_j - x_i]),   aggr one of max, mean, add

nn a stack of node-wise ops (Linear, activations, BatchNorm in eval; Dropout is a no-op in eval),
applied to every edge's row.

WHY a destination payload of the whole x_i: the per-edge input mixes source and destination
features before the (non-linear) nn, so every edge needs x_i itself (`needs_dst_in_message`,
shipped like GATv2's xr_i). The reduction is an ordinary mergeable aggregator (max / mean /
sum), so it is exact under any partitioning; `update` returns the aggregate unchanged. There is
no transform-then-propagate: folding nn's first Linear into the payloads would reorder its
float32 sums, so the layer always ships x.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import NodeOpStack

#: PyG's aggr names EdgeConv supports -> sparkgnn aggregator name.
EDGE_AGGRS = {"max": "max", "mean": "mean", "add": "sum", "sum": "sum"}


@register_conv("edge")
class EdgeConvLayer(MergeableConv):
    # update returns agg[i] as it is; nn runs per edge (message), on rows only
    row_wise = True

    def __init__(self, in_dim: int, nn: list, aggr: str = "max"):
        super().__init__()
        if aggr not in EDGE_AGGRS:
            raise ValueError(f"edge: aggr must be one of {sorted(EDGE_AGGRS)}, got {aggr!r}")
        self.in_dim, self.aggr = int(in_dim), aggr
        self.nn = NodeOpStack(nn)
        self.out_dim = self.nn.out_dim(2 * self.in_dim)
        self.aggregator = get_aggregator(EDGE_AGGRS[aggr])
        self.needs_dst_in_message = True

    def config(self) -> dict:
        return {"kind": self.kind, "in_dim": self.in_dim, "nn": self.nn.config(), "aggr": self.aggr}

    def src_width(self, pre_transform: bool) -> int:
        return self.in_dim

    def dst_width(self) -> int:
        return self.in_dim

    def msg_width(self, pre_transform: bool) -> int:
        return self.out_dim

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return h

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("edge: the message needs the destination payload")
        return self.nn(torch.cat([dst_e, src_e - dst_e], dim=-1))

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return agg
