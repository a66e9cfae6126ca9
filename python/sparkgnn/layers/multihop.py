"""Multi-hop convs: a layer that propagates K times runs as K engine rounds.

An engine round (a dataflow step, a serving hop, a PE store layer) runs one pass over the
in-edges. SGConv (Wu et al., "Simplifying Graph Convolutional Networks") is K GCN-normalised
propagations followed by one Linear:

    out = lin((D^-1/2 (A + I) D^-1/2)^K x)

so it is expanded into K rounds, each an ordinary GCNLayer (kind "gcn"): one of them carries
lin's weight, the others are weightless (`linear=False`) propagations, and the bias is added by
the last round. Every executor, strategy, the planner, model batching, the PE store and serving
run those rounds with GCN's own code paths (degree statistic `gcn_degree`, the "remaining"
self-loop policy, sparse products), so the layer needs no engine code of its own.

WHY the weight may move to the first round: propagation is linear and commutes with a linear
map, A^K (x W) = (A^K x) W, so the weight is applied where the rows are narrower: in the first
round when lin narrows the width (the K propagations then ship out_dim floats per row), else in
the last round (they ship in_dim). Both orders are exact up to float32 summation order.

Model expands a layer into its rounds (phases.expand_passes calls `rounds()`); the spec keeps
the layer's config, so a saved model rebuilds the same rounds, and the rounds' parameters are
stored under the rounds' names.
"""

from __future__ import annotations

from typing import cast

import torch

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.gcn import GCNLayer


class MultiRoundConv(MergeableConv):
    """A layer that runs as several engine rounds (module doc). It is never a round itself: the
    contract methods are its rounds', and Model only ever runs `rounds()`."""

    def rounds(self) -> list[MergeableConv]:
        raise NotImplementedError


@register_conv("sg")
class SGLayer(MultiRoundConv):
    """SGConv(in_dim, out_dim, K, add_self_loops, bias) as K GCN rounds (module doc).
    `weight_first` None picks the narrower placement (first round when out_dim < in_dim)."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        K: int = 1,
        add_self_loops: bool = True,
        bias: bool = True,
        use_edge_weight: bool = True,
        weight_first: bool | None = None,
    ):
        super().__init__()
        if int(K) < 1:
            raise ValueError(f"sg: K must be >= 1, got {K}")
        self.in_dim, self.out_dim, self.K = int(in_dim), int(out_dim), int(K)
        self.add_self_loops, self.uses_edge_weight = bool(add_self_loops), bool(use_edge_weight)
        self.has_bias = bool(bias)
        self.weight_first = self.out_dim < self.in_dim if weight_first is None else bool(weight_first)
        # the rounds' shared settings: GCN normalisation with or without self loops
        self.self_loops = "remaining" if self.add_self_loops else "none"
        self.aggregator = get_aggregator("sum")
        common = {
            "normalize": True,
            "add_self_loops": self.add_self_loops,
            "use_edge_weight": self.uses_edge_weight,
        }
        weighted = 0 if self.weight_first else self.K - 1
        steps = []
        for k in range(self.K):
            last = k == self.K - 1
            if k == weighted:
                steps.append(GCNLayer(self.in_dim, self.out_dim, bias=self.has_bias and last, **common))
            else:
                dim = self.out_dim if self.weight_first else self.in_dim
                steps.append(GCNLayer(dim, dim, bias=self.has_bias and last, linear=False, **common))
        self.steps = torch.nn.ModuleList(steps)
        self.required_stats = steps[0].required_stats

    @property
    def lin_round(self) -> GCNLayer:
        """The round that carries lin's weight."""
        return self._steps()[0 if self.weight_first else self.K - 1]

    @property
    def bias_round(self) -> GCNLayer:
        """The round that adds lin's bias (the last)."""
        return self._steps()[self.K - 1]

    def _steps(self) -> list[GCNLayer]:
        return [cast(GCNLayer, s) for s in self.steps]

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "K": self.K,
            "add_self_loops": self.add_self_loops,
            "bias": self.has_bias,
            "use_edge_weight": self.uses_edge_weight,
            "weight_first": self.weight_first,
        }

    def rounds(self) -> list[MergeableConv]:
        return list(self._steps())

    def src_width(self, pre_transform: bool) -> int:
        return self._steps()[0].src_width(pre_transform)
