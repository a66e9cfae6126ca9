"""GATv2Conv (Brody et al., "dynamic attention") as a mergeable layer; matches
torch_geometric.nn.GATv2Conv in eval: per head h,
    xl_j = W_l x_j + b_l,  xr_i = W_r x_i + b_r   (W_r = W_l with share_weights)
    e_ji = a_h . leaky_relu(xr_i + xl_j [+ W_e a_ji]),  alpha = softmax_j(e_ji),
    out_i = concat_h / mean_h (sum_j alpha_ji xl_j) [+ res(x_i)] [+ bias].

WHY the destination payload is the whole xr_i (H*C floats, not H as for GATConv): the
non-linearity sits between the source and destination terms, so the logit does not split into a
source part plus a destination part; every edge needs xr_i itself (`needs_dst_in_message`). The
softmax over a destination's in-edges is the same mergeable softmax aggregator GATConv uses
(running max / exp-sum / weighted sum per head, rescaled on merge), so it is exact under any
partitioning.

With edge_dim (`edge_attr_dim`), the edge's attribute row a_ji is mapped by PyG's lin_edge (W_e,
no bias) per edge in `message`; self loops get the mean of the node's in-edge attributes (PyG's
fill_value="mean", self-loop policy `replace_mean`).

Modes: pre_transform ships xl (H*C floats per node); raw mode ships x and applies W_l per edge
in `message`. Both are exact (the map is applied before the message either way); the planner
picks the narrower payload.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.base import register_conv
from sparkgnn.layers.gat import AttentionHeadsConv


@register_conv("gatv2")
class GATv2Layer(AttentionHeadsConv):
    def __init__(
        self,
        in_dim: int,
        channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        add_self_loops: bool = True,
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
        edge_dim: int | None = None,
    ):
        super().__init__(in_dim, channels, heads, concat, negative_slope, add_self_loops, residual)
        hc = self.heads * self.channels
        self.share_weights = bool(share_weights)
        self.weight_src = torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.bias_src = torch.nn.Parameter(torch.zeros(hc)) if bias else None
        self.weight_dst = None if self.share_weights else torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.bias_dst = torch.nn.Parameter(torch.zeros(hc)) if bias and not self.share_weights else None
        self.att = torch.nn.Parameter(torch.zeros(1, self.heads, self.channels))
        self._init_edge(edge_dim)
        self._init_output(bias=bias)

    def config(self) -> dict:
        return {**self._head_config(), "share_weights": self.share_weights, "residual": self.residual}

    def src_width(self, pre_transform: bool) -> int:
        return self.heads * self.channels if self._pre(pre_transform) else self.in_dim

    def dst_width(self) -> int:
        return self.heads * self.channels

    def _lin_src(self, h: Tensor) -> Tensor:
        return F.linear(h, self.weight_src, self.bias_src)

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return self._lin_src(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        if self.share_weights:
            return self._lin_src(h)
        assert self.weight_dst is not None  # built without shared weights
        return F.linear(h, self.weight_dst, self.bias_dst)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("gatv2: the message needs the destination payload")
        xl = src_e if self._pre(pre_transform) else self._lin_src(src_e)
        e = xl.shape[0]
        # x_i + x_j (+ lin_edge(edge_attr)), as PyG's edge_update adds them
        z = dst_e.view(e, self.heads, self.channels) + xl.view(e, self.heads, self.channels)
        if self.edge_attr_dim:
            z = z + self._edge_term(weight_e)
        z = F.leaky_relu(z, self.negative_slope)
        logit = (z * self.att).sum(dim=-1)
        return torch.cat([logit, xl], dim=1)
