"""TransformerConv (Shi et al., "Masked Label Prediction") as a mergeable layer; matches
torch_geometric.nn.TransformerConv in eval: per head h,

    q_i = W_q x_i + b_q,  k_j = W_k x_j + b_k,  v_j = W_v x_j + b_v
    alpha_ji = softmax_j(q_i . k_j / sqrt(C)),  m_i = sum_j alpha_ji v_j
    out_i = concat_h / mean_h m_i, then with root_weight: r_i = W_s x_i + b_s and
    out_i + r_i, or with beta: b = sigmoid(w_b . [out_i | r_i | out_i - r_i]), b r_i + (1 - b) out_i

WHY the destination payload is the query (H*C floats): the logit is a product of a destination
and a source term, so every edge needs q_i (`needs_dst_in_message`, OMEGA's all-gather). The
softmax over a destination's in-edges is GAT's mergeable softmax aggregator (running max /
exp-sum / weighted sum per head, rescaled on merge), so it is exact under any partitioning. There
are no self loops (PyG adds none). Root weight and beta read only the destination's row and the
merged aggregate, so they run in `update`.

With edge_dim (`edge_attr_dim`), PyG's lin_edge (W_e, no bias) maps the edge's attribute row
e_ji, and the result is added to both the key and the value of that edge:
k_j + W_e e_ji in the logit, v_j + W_e e_ji in the weighted sum. The attributes travel with the
edge, so this runs per edge in `message`; there are no self loops to give attributes to.

Modes: pre_transform ships [k | v] (2*H*C floats per node); raw mode ships x and applies W_k, W_v
per edge in `message`. Both are exact (the maps come before the message either way).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.base import register_conv
from sparkgnn.layers.gat import AttentionHeadsConv


@register_conv("transformer")
class TransformerLayer(AttentionHeadsConv):
    def __init__(
        self,
        in_dim: int,
        channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        bias: bool = True,
        root_weight: bool = True,
        edge_dim: int | None = None,
    ):
        super().__init__(in_dim, channels, heads, concat, 0.0, False, False)
        hc = self.heads * self.channels
        self.root_weight = bool(root_weight)
        self.beta = bool(beta) and self.root_weight  # PyG: beta only with a root weight
        self.has_bias = bool(bias)
        self.weight_key = torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.bias_key = torch.nn.Parameter(torch.zeros(hc)) if bias else None
        self.weight_query = torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.bias_query = torch.nn.Parameter(torch.zeros(hc)) if bias else None
        self.weight_value = torch.nn.Parameter(torch.zeros(hc, self.in_dim))
        self.bias_value = torch.nn.Parameter(torch.zeros(hc)) if bias else None
        self.weight_skip = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim)) if self.root_weight else None
        self.bias_skip = torch.nn.Parameter(torch.zeros(self.out_dim)) if bias and self.root_weight else None
        self.weight_beta = torch.nn.Parameter(torch.zeros(1, 3 * self.out_dim)) if self.beta else None
        self._init_edge(edge_dim)
        self._init_output(bias=False)

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "channels": self.channels,
            "heads": self.heads,
            "concat": self.concat,
            "beta": self.beta,
            "bias": self.has_bias,
            "root_weight": self.root_weight,
            **({"edge_dim": self.edge_attr_dim} if self.edge_attr_dim else {}),
        }

    def src_width(self, pre_transform: bool) -> int:
        return 2 * self.heads * self.channels if self._pre(pre_transform) else self.in_dim

    def dst_width(self) -> int:
        return self.heads * self.channels

    def _key_value(self, h: Tensor) -> Tensor:
        return torch.cat(
            [F.linear(h, self.weight_key, self.bias_key), F.linear(h, self.weight_value, self.bias_value)], dim=1
        )

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return self._key_value(h) if self._pre(pre_transform) else h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return F.linear(h, self.weight_query, self.bias_query)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("transformer: the message needs the destination payload (the query)")
        kv = src_e if self._pre(pre_transform) else self._key_value(src_e)
        e, hc = kv.shape[0], self.heads * self.channels
        key = kv[:, :hc].view(e, self.heads, self.channels)
        value = kv[:, hc:]
        if self.edge_attr_dim:  # lin_edge(e) added to the key and to the value, PyG's message
            edge = self._edge_term(weight_e)
            key = key + edge
            value = (value.view(e, self.heads, self.channels) + edge).view(e, hc)
        logit = (dst_e.view(e, self.heads, self.channels) * key).sum(dim=-1) / math.sqrt(self.channels)
        return torch.cat([logit, value], dim=1)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        out = agg if self.concat else agg.view(-1, self.heads, self.channels).mean(dim=1)
        if self.weight_skip is None:
            return out
        x_r = F.linear(h_dst, self.weight_skip, self.bias_skip)
        if self.weight_beta is None:
            return out + x_r
        beta = F.linear(torch.cat([out, x_r, out - x_r], dim=-1), self.weight_beta).sigmoid()
        return beta * x_r + (1 - beta) * out
