"""SAGEConv (GraphSAGE) as a mergeable layer; matches torch_geometric.nn.SAGEConv in eval:
out = lin_l(aggr_{j->i} p(x_j)) + lin_r(x_i), optionally L2-normalised, where p is the identity,
or with project=True relu(lin(x_j)): PyG projects the SOURCE rows only (x[0]); the root term reads
the raw destination row x[1]. The projection is per node, so it runs in `prepare_src`, before any
transform-then-propagate of lin_l.

The aggregation runs on raw neighbour features (no edge weights, no self loops); the root term,
lin_l's bias and the normalisation depend on the destination only and live in `update`.
WHY pre-transform is conditional: lin_l commutes with the aggregation only if the aggregation is
linear (sum, mean). For max/min/power-mean/var/std, x_j W would change the result, so those
variants always ship raw features.

The aggregation is named by the registry ("sum", "mean", "max", "min", "powermean", "var",
"std", "softmax", "rawmoment", "moments"). "moments" (OMEGA's normalized moments, no PyG
counterpart) runs in two passes over the in-edges; the Model runs such a layer as two engine rounds
(layers/phases.py). "softmax" reproduces PyG's SoftmaxAggregation: a per-feature softmax over
neighbours with temperature t, i.e. the attention aggregator with one head per feature
(message [x*t | x]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv


@register_conv("sage")
class SAGELayer(MergeableConv):
    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        aggr: str = "mean",
        aggr_options: dict | None = None,
        normalize: bool = False,
        root_weight: bool = True,
        bias: bool = True,
        project: bool = False,
    ):
        super().__init__()
        self.in_dim, self.out_dim = int(in_dim), int(out_dim)
        self.aggr, self.aggr_options = str(aggr), dict(aggr_options or {})
        self.normalize, self.root_weight = bool(normalize), bool(root_weight)
        # project=True: PyG's lin (in -> in, with bias) then relu, on source rows only
        self.project = bool(project)
        self.weight_p = torch.nn.Parameter(torch.zeros(self.in_dim, self.in_dim)) if self.project else None
        self.bias_p = torch.nn.Parameter(torch.zeros(self.in_dim)) if self.project else None
        if self.aggr == "softmax":
            t = self.aggr_options.get("t", 1.0)
            self._t = torch.tensor(t, dtype=torch.float32).view(1, -1) if isinstance(t, (list, tuple)) else float(t)
            self._scale_logits = bool(self.aggr_options.get("transform", isinstance(t, list) or t != 1))
            self.aggregator = get_aggregator("softmax", heads=self.in_dim)
        else:
            self.aggregator = get_aggregator(self.aggr, **self.aggr_options)
        self.can_pre_transform = self.aggregator.linear
        # lin_l reads the aggregate, which is wider than a message for multi-order aggregators
        # (moments with n=[2, 3]: one block per order), as PyG sizes lin_l by the aggregation's output
        self.weight_l = torch.nn.Parameter(torch.zeros(self.out_dim, self.aggregator.out_width(self.msg_width(False))))
        self.bias_l = torch.nn.Parameter(torch.zeros(self.out_dim)) if bias else None
        self.weight_r = torch.nn.Parameter(torch.zeros(self.out_dim, self.in_dim)) if root_weight else None

    def config(self):
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "aggr": self.aggr,
            "aggr_options": self.aggr_options,
            "normalize": self.normalize,
            "root_weight": self.root_weight,
            "bias": self.bias_l is not None,
            "project": self.project,
        }

    def src_width(self, pre_transform):
        return self.out_dim if self._pre(pre_transform) else self.in_dim

    def msg_width(self, pre_transform):
        w = self.src_width(pre_transform)
        return 2 * w if self.aggr == "softmax" else w

    def prepare_src(self, h, stats, pre_transform):
        if self.weight_p is not None:
            h = F.linear(h, self.weight_p, self.bias_p).relu()
        return F.linear(h, self.weight_l) if self._pre(pre_transform) else h

    def message(self, src_e, dst_e, weight_e, pre_transform):
        if self.aggr == "softmax":
            t = self._t.to(src_e.device) if torch.is_tensor(self._t) else self._t
            logit = src_e * t if self._scale_logits else src_e
            return torch.cat([logit, src_e], dim=1)
        return src_e

    def message_scale(self, weight_e, pre_transform):
        return (self.aggr != "softmax"), None

    def update(self, h_dst, agg, stats, pre_transform):
        if self._pre(pre_transform):
            out = agg + self.bias_l if self.bias_l is not None else agg
        else:
            out = F.linear(agg, self.weight_l, self.bias_l)
        if self.weight_r is not None:
            out = out + F.linear(h_dst, self.weight_r)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out
