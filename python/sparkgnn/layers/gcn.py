"""GCNConv (Kipf & Welling) as a mergeable layer; matches torch_geometric.nn.GCNConv in eval.

PyG computes out_i = b + sum_{j->i} d_j^-1/2 w_ji d_i^-1/2 (x_j W), with d the weighted in-degree
after add_remaining_self_loops. The edge coefficient factors into a source part and a destination
part. WHY the split matters: the source factor d_j^-1/2 is folded into the node payload in
`prepare_src` (computed once per node, not per edge) and the destination factor d_i^-1/2 is
constant over i's in-edges, so it moves out of the sum into `update`. Messages then need no
destination payload and the aggregation is a plain (linear, trivially mergeable) sum, which also
makes transform-then-propagate exact: the planner may ship x_j W or x_j, whichever is narrower.

`linear=False` drops W (out_dim == in_dim): a weightless normalised propagation round, which is
what LGConv is and what SGConv / multi-hop layers run K times (layers/multihop.py). It reuses
every path GCN has (degree statistics, self-loop policy, sparse products) with nothing to
pre-transform.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv


@register_conv("gcn")
class GCNLayer(MergeableConv):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        normalize: bool = True,
        add_self_loops: bool = True,
        bias: bool = True,
        use_edge_weight: bool = True,
        linear: bool = True,
    ):
        super().__init__()
        if add_self_loops and not normalize:
            raise ValueError("GCN: add_self_loops requires normalize (as in PyG)")
        if not linear and int(in_dim) != int(out_dim):
            raise ValueError(f"GCN: linear=False keeps the width, so in_dim {in_dim} must equal out_dim {out_dim}")
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.normalize, self.add_self_loops = bool(normalize), bool(add_self_loops)
        self.uses_edge_weight = bool(use_edge_weight)
        self.linear = bool(linear)
        self.weight = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim)) if self.linear else None
        self.bias = torch.nn.Parameter(torch.zeros(self.out_dim)) if bias else None
        self.aggregator = get_aggregator("sum")
        self.can_pre_transform = self.linear
        self.self_loops = "remaining" if self.add_self_loops else "none"
        if not self.normalize:
            self.required_stats = ()
        else:
            self.required_stats = ("gcn_degree",) if self.add_self_loops else ("weighted_in_degree",)

    def config(self):
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "normalize": self.normalize,
            "add_self_loops": self.add_self_loops,
            "bias": self.bias is not None,
            "use_edge_weight": self.uses_edge_weight,
            "linear": self.linear,
        }

    def _deg_inv_sqrt(self, stats: dict) -> Tensor:
        deg = stats[self.required_stats[0]].to(torch.float32)
        dis = deg.pow(-0.5)
        return dis.masked_fill(dis == float("inf"), 0.0)

    def src_width(self, pre_transform):
        return self.out_dim if self._pre(pre_transform) else self.in_dim

    def prepare_src(self, h, stats, pre_transform):
        z = F.linear(h, self.weight) if self._pre(pre_transform) and self.weight is not None else h
        if self.normalize:
            z = z * self._deg_inv_sqrt(stats).unsqueeze(-1)
        return z

    def message(self, src_e, dst_e, weight_e: Tensor | None, pre_transform):
        if weight_e is None or not self.uses_edge_weight:
            return src_e
        return src_e * weight_e.to(src_e.dtype).unsqueeze(-1)

    def message_scale(self, weight_e, pre_transform):
        if weight_e is None or not self.uses_edge_weight:
            return True, None
        return True, weight_e.to(torch.float32)

    def update(self, h_dst, agg, stats, pre_transform):
        if self.normalize:
            agg = agg * self._deg_inv_sqrt(stats).unsqueeze(-1)
        out = agg if self._pre(pre_transform) or self.weight is None else F.linear(agg, self.weight)
        if self.bias is not None:
            out = out + self.bias
        return out
