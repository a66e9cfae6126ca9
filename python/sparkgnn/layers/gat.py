"""GATConv (v1, Velickovic et al.) as a mergeable layer; matches torch_geometric.nn.GATConv in
eval: per head h,
    e_ji = leaky_relu(a_src . x_j W_h + a_dst . x_i W_h [+ a_edge . W_e e_ji]),  alpha = softmax_j(e_ji),
    out_i = concat_h / mean_h (sum_j alpha_ji x_j W_h) [+ res(x_i)] [+ bias].

WHY a destination payload: the attention logit needs the destination's a_dst . x_i W, which in
a partitioned graph is not where the edge is; the layer therefore declares
`needs_dst_in_message` and ships a_dst (H floats per node, not the features) to the edges
(OMEGA's all-gather of destination embeddings, reduced to what the logit needs). The softmax
normalisation is global over a node's in-edges, so it is done by the mergeable softmax
aggregator (running max / exp-sum / weighted sum, rescaled on merge).

With edge_dim (`edge_attr_dim`), the edge's attribute row e_ji enters the logit through PyG's
lin_edge (W_e, no bias) and att_edge, computed per edge in `message` from the attributes that
travel with the edge; self loops get the mean of the node's in-edge attributes (PyG's
fill_value="mean", self-loop policy `replace_mean`).

Modes: pre_transform ships [x W | a_src] (H*C + H floats per node); raw mode ships x and applies
W and a_src per edge in `message`. Both are exact; the planner picks the cheaper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv


class AttentionHeadsConv(MergeableConv):
    """What GATConv and GATv2Conv share: H heads of C channels each, concatenated or averaged in
    `update`, the mergeable softmax aggregator (one logit per head, so every message is
    [logits (H) | values (H*C)] and needs a destination payload), PyG's self-loop replacement, and
    the optional residual map and bias added after the merge. A subclass's constructor passes the
    head options to this one, builds its own projection and attention weights, then calls
    `_init_output`, so its parameters register in the order projection, attention, residual, bias."""

    # update reads h_dst[i] and agg[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(
        self,
        in_dim: int,
        channels: int,
        heads: int,
        concat: bool,
        negative_slope: float,
        add_self_loops: bool,
        residual: bool,
    ):
        """Set the head options and the output width (a subclass passes its own arguments on)."""
        super().__init__()
        self.in_dim, self.channels, self.heads = int(in_dim), int(channels), int(heads)
        if min(self.in_dim, self.channels, self.heads) < 1:
            raise ValueError(f"{self.kind}: in_dim, channels and heads must be >= 1, got {in_dim}, {channels}, {heads}")
        self.concat, self.negative_slope = bool(concat), float(negative_slope)
        self.add_self_loops, self.residual = bool(add_self_loops), bool(residual)
        hc = self.heads * self.channels
        self.out_dim = hc if self.concat else self.channels

    def _init_edge(self, edge_dim: int | None) -> None:
        """PyG's lin_edge (no bias) for edge attributes of width edge_dim (None: no attributes);
        call with the subclass's attention weights."""
        if edge_dim is not None and int(edge_dim) < 1:
            raise ValueError(f"{self.kind}: edge_dim must be >= 1 (or None), got {edge_dim}")
        self.edge_attr_dim = int(edge_dim or 0)
        hc = self.heads * self.channels
        self.weight_edge = torch.nn.Parameter(torch.zeros(hc, self.edge_attr_dim)) if edge_dim else None

    def _edge_term(self, attr_e: Tensor | None) -> Tensor:
        """lin_edge(e) per edge, [E, H, C] (only for a layer with edge attributes)."""
        if attr_e is None or self.weight_edge is None:
            raise ValueError(f"{self.kind}: the message needs the edge attributes (edge_dim={self.edge_attr_dim})")
        return F.linear(attr_e, self.weight_edge).view(-1, self.heads, self.channels)

    def _init_output(self, *, bias: bool) -> None:
        """Residual map, bias and the attention contract; call after the subclass's weights."""
        self.weight_res = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim)) if self.residual else None
        self.bias = torch.nn.Parameter(torch.zeros(self.out_dim)) if bias else None
        self.aggregator = get_aggregator("softmax", heads=self.heads)
        loops = "replace_mean" if self.edge_attr_dim else "replace"
        self.self_loops = loops if self.add_self_loops else "none"
        self.needs_dst_in_message = True
        self.can_pre_transform = True

    def _head_config(self) -> dict:
        """The config entries every attention layer has; a subclass appends its own."""
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "channels": self.channels,
            "heads": self.heads,
            "concat": self.concat,
            "negative_slope": self.negative_slope,
            "add_self_loops": self.add_self_loops,
            "bias": self.bias is not None,
            **({"edge_dim": self.edge_attr_dim} if self.edge_attr_dim else {}),
        }

    def msg_width(self, pre_transform: bool) -> int:
        return self.heads + self.heads * self.channels

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        out = agg if self.concat else agg.view(-1, self.heads, self.channels).mean(dim=1)
        if self.weight_res is not None:
            out = out + F.linear(h_dst, self.weight_res)
        if self.bias is not None:
            out = out + self.bias
        return out


@register_conv("gat")
class GATLayer(AttentionHeadsConv):
    def __init__(
        self,
        in_dim: int,
        channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        add_self_loops: bool = True,
        bias: bool = True,
        residual: bool = False,
        separate_dst_lin: bool = False,
        edge_dim: int | None = None,
    ):
        super().__init__(in_dim, channels, heads, concat, negative_slope, add_self_loops, residual)
        hc = self.heads * self.channels
        self.separate_dst_lin = bool(separate_dst_lin)
        self.weight = torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.weight_dst = torch.nn.Parameter(torch.zeros(hc, self.in_dim)) if self.separate_dst_lin else None
        self.att_src = torch.nn.Parameter(torch.zeros(1, self.heads, self.channels))
        self.att_dst = torch.nn.Parameter(torch.zeros(1, self.heads, self.channels))
        self._init_edge(edge_dim)
        self.att_edge = torch.nn.Parameter(torch.zeros(1, self.heads, self.channels)) if edge_dim else None
        self._init_output(bias=bias)

    def config(self) -> dict:
        return {**self._head_config(), "residual": self.residual, "separate_dst_lin": self.separate_dst_lin}

    def src_width(self, pre_transform):
        hc = self.heads * self.channels
        return hc + self.heads if self._pre(pre_transform) else self.in_dim

    def dst_width(self):
        return self.heads

    def _src_payload(self, h):
        n = h.shape[0]
        xs = F.linear(h, self.weight).view(n, self.heads, self.channels)
        a_src = (xs * self.att_src).sum(dim=-1)
        return torch.cat([xs.view(n, -1), a_src], dim=1)

    def prepare_src(self, h, stats, pre_transform):
        return self._src_payload(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h, stats):
        n = h.shape[0]
        w = self.weight_dst if self.weight_dst is not None else self.weight
        xd = F.linear(h, w).view(n, self.heads, self.channels)
        return (xd * self.att_dst).sum(dim=-1)

    def message(self, src_e, dst_e, weight_e, pre_transform):
        payload = src_e if self._pre(pre_transform) else self._src_payload(src_e)
        hc = self.heads * self.channels
        alpha = payload[:, hc:] + dst_e
        if self.att_edge is not None:  # alpha_j + alpha_i, then + alpha_edge, PyG's order
            alpha = alpha + (self._edge_term(weight_e) * self.att_edge).sum(dim=-1)
        logit = F.leaky_relu(alpha, self.negative_slope)
        return torch.cat([logit, payload[:, :hc]], dim=1)
