"""GENConv (Li et al., "DeeperGCN") as a mergeable layer; matches torch_geometric.nn.GENConv in
eval:

    m_ji  = relu(s_j [+ a_ji]) + eps,  s_j = lin_src(x_j) (x_j when in = out), a_ji = lin_edge(e_ji)
            (e_ji itself when edge_dim = out)
    agg_i = AGG_{j->i} m_ji        softmax with temperature t, power mean with exponent p, or
                                   sum / mean / max / min / var / std
    [agg_i = normalize(agg_i) * ||x_i|| * scale]           with msg_norm (MessageNorm, p = 2)
    out_i = mlp(agg_i + d_i),      d_i = lin_dst(x_i) (x_i when in = out)

WHY mergeable: every aggregation GENConv offers here has a partial state that merges exactly.
The softmax aggregation is a per-channel attention (logit t * m, value m), the same mergeable
softmax state GAT uses with one head per channel (running max / exp-sum / weighted sum, rescaled
on merge); a learnable t is a one-element tensor, kept as PyG multiplies it. The power mean keeps
[sum clamp(m)^p | count] (aggregators.PowerMeanAggregator, PyG's clamps before pow(p) and before
the 1/p root, skipped when p is the fixed number 1). MessageNorm reads only the merged aggregate
and the destination's own row, and lin_dst, the root addition and the MLP read only the
destination, so all of them run in `update`.

Payload: lin_src is applied per node in `prepare_src` (the message is non-linear in it, so there is
no transform-then-propagate alternative); edge features travel with the edge (`edge_attr_dim`)
and lin_edge is applied per edge in `message`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import NodeOpStack

#: aggregations GENConv runs (registry names of aggregators.py; "softmax" as a per-channel attention)
GEN_AGGRS = ("softmax", "powermean", "sum", "mean", "max", "min", "var", "std")


@register_conv("gen")
class GENLayer(MergeableConv):
    # update reads h_dst[i] and agg[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        mlp: list,
        aggr: str = "softmax",
        aggr_options: dict | None = None,
        eps: float = 1e-7,
        bias: bool = False,
        msg_norm: bool = False,
        edge_dim: int | None = None,
        ambiguous_edge_dim: int | None = None,
    ):
        """`ambiguous_edge_dim`: set (to out_dim) for a layer that reads no edge features although
        its PyG conv would add edge_attr of that width to its messages if called with them, which
        its conversion could not see (a bare GENConv without lin_edge); Model.check_edge_attr
        refuses a graph carrying edge features of that width rather than guess."""
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        if min(self.in_dim, self.out_dim) < 1:
            raise ValueError(f"gen: in_dim and out_dim must be >= 1, got {in_dim}, {out_dim}")
        if aggr not in GEN_AGGRS:
            raise ValueError(f"gen: aggr {aggr!r} is not one of {', '.join(GEN_AGGRS)}")
        if edge_dim is not None and int(edge_dim) < 1:
            raise ValueError(f"gen: edge_dim must be >= 1 (or None), got {edge_dim}")
        self.aggr, self.aggr_options = str(aggr), dict(aggr_options or {})
        self.eps, self.has_bias, self.msg_norm = float(eps), bool(bias), bool(msg_norm)
        self.edge_dim = None if edge_dim is None else int(edge_dim)
        self.edge_attr_dim = self.edge_dim or 0
        if ambiguous_edge_dim is not None and (self.edge_dim is not None or int(ambiguous_edge_dim) != self.out_dim):
            raise ValueError(
                f"gen: ambiguous_edge_dim is out_dim ({self.out_dim}) on a layer without edge_dim, got "
                f"{ambiguous_edge_dim} with edge_dim {self.edge_dim}"
            )
        self.ambiguous_edge_dim = None if ambiguous_edge_dim is None else int(ambiguous_edge_dim)
        d_in, d_out = self.in_dim, self.out_dim
        # PyG's lin_src / lin_dst exist only when in != out, lin_edge only when edge_dim != out
        self.weight_src = torch.nn.Parameter(torch.zeros(d_out, d_in)) if d_in != d_out else None
        self.bias_src = torch.nn.Parameter(torch.zeros(d_out)) if d_in != d_out and bias else None
        self.weight_dst = torch.nn.Parameter(torch.zeros(d_out, d_in)) if d_in != d_out else None
        self.bias_dst = torch.nn.Parameter(torch.zeros(d_out)) if d_in != d_out and bias else None
        lin_edge = self.edge_dim is not None and self.edge_dim != d_out
        self.weight_edge = torch.nn.Parameter(torch.zeros(d_out, self.edge_attr_dim)) if lin_edge else None
        self.bias_edge = torch.nn.Parameter(torch.zeros(d_out)) if lin_edge and bias else None
        self.msg_scale = torch.nn.Parameter(torch.ones(1)) if self.msg_norm else None
        self.mlp = NodeOpStack(mlp)
        if self.mlp.out_dim(d_out) != d_out:
            raise ValueError(f"gen: the MLP maps {d_out} features to {self.mlp.out_dim(d_out)}, not {d_out}")
        if self.aggr == "softmax":
            t = self.aggr_options.get("t", 1.0)
            self._t = torch.tensor(t, dtype=torch.float32).view(1, -1) if isinstance(t, (list, tuple)) else float(t)
            self._scale_logits = bool(self.aggr_options.get("transform", isinstance(t, list) or t != 1))
            self.aggregator = get_aggregator("softmax", heads=d_out)
        else:
            self.aggregator = get_aggregator(self.aggr, **self.aggr_options)

    def config(self) -> dict:
        config = {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "mlp": self.mlp.config(),
            "aggr": self.aggr,
            "aggr_options": self.aggr_options,
            "eps": self.eps,
            "bias": self.has_bias,
            "msg_norm": self.msg_norm,
            "edge_dim": self.edge_dim,
        }
        if self.ambiguous_edge_dim is not None:  # absent otherwise: earlier models keep their fingerprint
            config["ambiguous_edge_dim"] = self.ambiguous_edge_dim
        return config

    def src_width(self, pre_transform: bool) -> int:
        return self.out_dim

    def msg_width(self, pre_transform: bool) -> int:
        return 2 * self.out_dim if self.aggr == "softmax" else self.out_dim

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return h if self.weight_src is None else F.linear(h, self.weight_src, self.bias_src)

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        m = src_e
        if self.edge_attr_dim:
            if weight_e is None or weight_e.dim() != 2:
                raise ValueError(f"gen: the message needs the edge attributes [E, {self.edge_attr_dim}]")
            m = m + (weight_e if self.weight_edge is None else F.linear(weight_e, self.weight_edge, self.bias_edge))
        m = m.relu() + self.eps
        if self.aggr != "softmax":
            return m
        t = self._t.to(m.device) if torch.is_tensor(self._t) else self._t
        return torch.cat([m * t if self._scale_logits else m, m], dim=1)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        out = agg
        if self.msg_scale is not None:  # MessageNorm(x_dst, agg), p = 2
            out = F.normalize(out, p=2.0, dim=-1) * h_dst.norm(p=2.0, dim=-1, keepdim=True) * self.msg_scale
        root = h_dst if self.weight_dst is None else F.linear(h_dst, self.weight_dst, self.bias_dst)
        return self.mlp(out + root)
