"""GINConv as a mergeable layer; matches torch_geometric.nn.GINConv in eval:
out = nn((1 + eps) * x_i + sum_{j->i} x_j), nn a stack of node-wise ops (Linear, activations,
BatchNorm in eval; Dropout is a no-op in eval and dropped).

The sum is the only graph-dependent part; the (1+eps) root term and the whole MLP depend on the
destination alone and run in `update`. WHY GIN can still pre-transform: when nn starts with a
Linear W1, W1((1+eps)x_i + sum x_j) = (1+eps) x_i W1 + sum x_j W1 (bias added once, after), so
the payload shipped to edges can be x W1, often far narrower than x (e.g. Cora 1433 -> 64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import NodeOpStack


@register_conv("gin")
class GINLayer(MergeableConv):
    eps: torch.Tensor

    def __init__(self, in_dim: int, nn: list):
        super().__init__()
        self.in_dim = int(in_dim)
        self.nn = NodeOpStack(nn)
        self.out_dim = self.nn.out_dim(self.in_dim)
        self.register_buffer("eps", torch.zeros(1))
        self.aggregator = get_aggregator("sum")
        self.can_pre_transform = self.nn.first_linear() is not None

    def config(self):
        return {"kind": self.kind, "in_dim": self.in_dim, "nn": self.nn.config()}

    def src_width(self, pre_transform):
        if self._pre(pre_transform):
            return self.nn.first_linear().out_features
        return self.in_dim

    def prepare_src(self, h, stats, pre_transform):
        if self._pre(pre_transform):
            return F.linear(h, self.nn.first_linear().weight)
        return h

    def message(self, src_e, dst_e, weight_e, pre_transform):
        return src_e

    def message_scale(self, weight_e, pre_transform):
        return True, None

    def update(self, h_dst, agg, stats, pre_transform):
        if self._pre(pre_transform):
            lin = self.nn.first_linear()
            z = agg + (1 + self.eps) * F.linear(h_dst, lin.weight)
            if lin.bias is not None:
                z = z + lin.bias
            return self.nn(z, start=1)
        return self.nn(agg + (1 + self.eps) * h_dst)
