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


@register_conv("gine")
class GINELayer(GINLayer):
    """GINEConv (Hu et al.) as a mergeable layer; matches torch_geometric.nn.GINEConv in eval:
    out = nn((1 + eps) * x_i + sum_{j->i} relu(x_j + lin(e_ji))), lin a Linear(edge_dim, in_dim)
    when edge_dim is given, else the identity (the edge attributes must then have x's width).

    WHY no transform-then-propagate: the ReLU sits between the source row and the aggregation,
    so the payload is x itself and the message is formed per edge from x_j and the attributes that
    travel with the edge (`edge_attr_dim`); the sum, the root term and nn are GIN's."""

    def __init__(self, in_dim: int, nn: list, edge_dim: int | None = None):
        super().__init__(in_dim, nn)
        if edge_dim is not None and int(edge_dim) < 1:
            raise ValueError(f"gine: edge_dim must be >= 1 (or None), got {edge_dim}")
        self.edge_dim = None if edge_dim is None else int(edge_dim)
        self.lin = torch.nn.Linear(self.edge_dim, self.in_dim) if self.edge_dim else None
        self.edge_attr_dim = self.edge_dim or self.in_dim
        self.can_pre_transform = False

    def config(self):
        return {**super().config(), "edge_dim": self.edge_dim}

    def message(self, src_e, dst_e, weight_e, pre_transform):
        if weight_e is None or weight_e.dim() != 2:
            raise ValueError(f"gine: the message needs the edge attributes [E, {self.edge_attr_dim}]")
        attr = self.lin(weight_e) if self.lin is not None else weight_e
        return (src_e + attr).relu()

    def message_scale(self, weight_e, pre_transform):
        return False, None
