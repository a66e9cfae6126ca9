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

TAGConv and APPNP keep more than the propagated features between their hops (TAGConv the
running sum of its projected hops, APPNP its teleport input x_0), so their rounds (HopRound) read
and write rows [x | carry]: only x travels to the edges, the carry stays with its vertex, and each
round is a registered conv kind of its own ("tag_round", "appnp_round") that a bundle or a saved
model rebuilds from its config. ChebConv runs the same way (ChebRound: rows [T_{k-1} | T_{k-2} |
running sum]); its Laplacian divides by OUT-degrees, the statistic `laplacian_degree` that the
engine computes on demand for the runs that read it (engine.prepare.ensure_out_stats).

Model expands a layer into its rounds (phases.expand_passes calls `rounds()`); the spec keeps
the layer's config, so a saved model rebuilds the same rounds, and the rounds' parameters are
stored under the rounds' names.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.layers.aggregators import get_aggregator
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.gcn import GCNLayer


class MultiRoundConv(MergeableConv):
    """A layer that runs as several engine rounds (module doc). It is never a round itself: the
    contract methods are its rounds', and Model only ever runs `rounds()`."""

    steps: torch.nn.ModuleList
    in_dim: int

    def rounds(self) -> list[MergeableConv]:
        """The engine rounds this layer runs as, in order (its `steps`)."""
        return [cast(MergeableConv, s) for s in self.steps]

    def src_width(self, pre_transform: bool) -> int:
        """The width of the rows the first round reads: the layer's input (HopRounds carry more,
        but read the input columns first)."""
        return self.in_dim


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


class HopRound(GCNLayer):
    """One propagation of a multi-hop layer whose rows carry more than the propagated features.

    The row a round reads is [x | carry]: x (the first `width` columns) is what propagates, the
    carry is what the layer must keep per vertex between its hops (TAGConv's running sum of
    projected hops, APPNP's teleport input x0). Only x travels to the edges: the propagation is
    GCN's weightless round on x (degree statistic, self-loop policy, edge weights and sparse
    products all GCN's), and `combine` (a subclass's) builds the next row from the vertex's own
    row and its propagated x, so the carry never leaves the vertex. The first round of a layer
    reads the layer's input, which is x alone (carry 0)."""

    row_wise = True  # update reads h_dst[i], agg[i] and stats[i] only

    def __init__(self, width: int, carry: int, normalize: bool, add_self_loops: bool, use_edge_weight: bool):
        super().__init__(
            width,
            width,
            normalize=normalize,
            add_self_loops=add_self_loops,
            bias=False,
            use_edge_weight=use_edge_weight,
            linear=False,
        )
        self.width, self.carry = int(width), int(carry)
        if self.carry < 0:
            raise ValueError(f"{self.kind}: carry must be >= 0, got {carry}")
        self.in_dim = self.width + self.carry

    def _hop_config(self) -> dict:
        return {
            "kind": self.kind,
            "width": self.width,
            "normalize": self.normalize,
            "add_self_loops": self.add_self_loops,
            "use_edge_weight": self.uses_edge_weight,
        }

    def src_width(self, pre_transform: bool) -> int:
        return self.width

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return super().prepare_src(h[:, : self.width] if self.carry else h, stats, False)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        if self.normalize:  # GCN's destination factor; no weight, no bias (combine has them)
            agg = agg * self._deg_inv_sqrt(stats).unsqueeze(-1)
        return self.combine(h_dst, agg)

    def combine(self, h_dst: Tensor, x: Tensor) -> Tensor:
        """The next row from the vertex's row [x_prev | carry] and its propagated x."""
        raise NotImplementedError


@register_conv("tag_round")
class TAGRound(HopRound):
    """Hop k of TAGConv: out = x W_0 + sum_k (A^k x) W_k [+ b], the carry the running sum of
    the projected hops (out_dim columns). The first hop starts the sum with x W_0, the last adds
    the bias and returns the sum alone, in PyG's order of additions."""

    def __init__(
        self,
        width: int,
        out_dim: int,
        first: bool,
        last: bool,
        normalize: bool = True,
        use_edge_weight: bool = True,
        bias: bool = True,
    ):
        super().__init__(width, 0 if first else int(out_dim), normalize, False, use_edge_weight)
        self.first, self.last = bool(first), bool(last)
        self.sum_dim = int(out_dim)
        self.out_dim = self.sum_dim if self.last else self.width + self.sum_dim
        self.weight_0 = torch.nn.Parameter(torch.zeros(self.sum_dim, self.width)) if self.first else None
        self.weight_k = torch.nn.Parameter(torch.zeros(self.sum_dim, self.width))
        self.bias = torch.nn.Parameter(torch.zeros(self.sum_dim)) if bias and self.last else None

    def config(self) -> dict:
        cfg = self._hop_config()
        cfg.pop("add_self_loops")
        return {**cfg, "out_dim": self.sum_dim, "first": self.first, "last": self.last, "bias": self.bias is not None}

    def combine(self, h_dst: Tensor, x: Tensor) -> Tensor:
        total = F.linear(h_dst, self.weight_0) if self.weight_0 is not None else h_dst[:, self.width :]
        total = total + F.linear(x, self.weight_k)
        if self.last:
            return total + self.bias if self.bias is not None else total
        return torch.cat([x, total], dim=1)


@register_conv("tag")
class TAGLayer(MultiRoundConv):
    """TAGConv(in_dim, out_dim, K, bias, normalize) as K TAGRounds (HopRound): gcn_norm without
    self loops (the weighted in-degree) when `normalize`, plain (weighted) sums otherwise."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        K: int = 3,
        bias: bool = True,
        normalize: bool = True,
        use_edge_weight: bool = True,
    ):
        super().__init__()
        if int(K) < 1:
            raise ValueError(f"tag: K must be >= 1, got {K}")
        self.in_dim, self.out_dim, self.K = int(in_dim), int(out_dim), int(K)
        self.has_bias, self.normalize, self.uses_edge_weight = bool(bias), bool(normalize), bool(use_edge_weight)
        self.aggregator = get_aggregator("sum")
        self.steps = torch.nn.ModuleList(
            TAGRound(
                self.in_dim,
                self.out_dim,
                first=k == 0,
                last=k == self.K - 1,
                normalize=self.normalize,
                use_edge_weight=self.uses_edge_weight,
                bias=self.has_bias,
            )
            for k in range(self.K)
        )
        self.required_stats = self.tag_rounds()[0].required_stats

    def tag_rounds(self) -> list[TAGRound]:
        return [cast(TAGRound, s) for s in self.steps]

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "K": self.K,
            "bias": self.has_bias,
            "normalize": self.normalize,
            "use_edge_weight": self.uses_edge_weight,
        }


@register_conv("appnp_round")
class APPNPRound(HopRound):
    """Hop k of APPNP: x_{k+1} = (1 - alpha) A x_k + alpha x_0, the carry x_0 (the layer's input,
    `width` columns); the last hop returns x_K alone."""

    def __init__(
        self,
        width: int,
        alpha: float,
        first: bool,
        last: bool,
        normalize: bool = True,
        add_self_loops: bool = True,
        use_edge_weight: bool = True,
    ):
        super().__init__(
            width, 0 if first else int(width), normalize, bool(add_self_loops) and bool(normalize), use_edge_weight
        )
        self.alpha, self.first, self.last = float(alpha), bool(first), bool(last)
        self.out_dim = self.width if self.last else 2 * self.width

    def config(self) -> dict:
        return {**self._hop_config(), "alpha": self.alpha, "first": self.first, "last": self.last}

    def combine(self, h_dst: Tensor, x: Tensor) -> Tensor:
        x0 = h_dst if self.first else h_dst[:, self.width :]
        # PyG's two statements, in its order
        x = x * (1 - self.alpha)
        x = x + self.alpha * x0
        return x if self.last else torch.cat([x, x0], dim=1)


@register_conv("appnp")
class APPNPLayer(MultiRoundConv):
    """APPNP(K, alpha, add_self_loops, normalize) at width `dim` as K APPNPRounds (HopRound):
    gcn_norm (with PyG's remaining self loops when add_self_loops) when `normalize`, plain
    (weighted) sums without self loops otherwise, as PyG adds loops only inside gcn_norm."""

    def __init__(
        self,
        dim: int,
        K: int,
        alpha: float,
        add_self_loops: bool = True,
        normalize: bool = True,
        use_edge_weight: bool = True,
    ):
        super().__init__()
        if int(K) < 1:
            raise ValueError(f"appnp: K must be >= 1, got {K}")
        self.in_dim = self.out_dim = int(dim)
        self.K, self.alpha = int(K), float(alpha)
        self.add_self_loops, self.normalize = bool(add_self_loops), bool(normalize)
        self.uses_edge_weight = bool(use_edge_weight)
        self.aggregator = get_aggregator("sum")
        self.steps = torch.nn.ModuleList(
            APPNPRound(
                self.in_dim,
                self.alpha,
                first=k == 0,
                last=k == self.K - 1,
                normalize=self.normalize,
                add_self_loops=self.add_self_loops,
                use_edge_weight=self.uses_edge_weight,
            )
            for k in range(self.K)
        )
        first = cast(APPNPRound, self.steps[0])
        self.required_stats, self.self_loops = first.required_stats, first.self_loops

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "dim": self.in_dim,
            "K": self.K,
            "alpha": self.alpha,
            "add_self_loops": self.add_self_loops,
            "normalize": self.normalize,
            "use_edge_weight": self.uses_edge_weight,
        }


#: ChebConv's Laplacian normalisations sparkgnn runs (models/pyg_multihop.py says why not None).
CHEB_NORMALIZATIONS = ("sym", "rw")
#: The statistic ChebConv normalises by: get_laplacian's degree (layers/stats.py).
LAPLACIAN_DEGREE = "laplacian_degree"


@register_conv("cheb_round")
class ChebRound(HopRound):
    """Hop k (1..K-1) of ChebConv: T_1 = L^ x, T_k = 2 L^ T_{k-1} - T_{k-2}, out = sum_k T_k W_k
    [+ b], with L^ = 2 L / lambda_max - I and lambda_max = 2.

    WHY lambda_max is 2 and the diagonal vanishes: PyG sets lambda_max = 2 * the largest entry of
    the normalised Laplacian, whose diagonal is 1 and whose off-diagonal entries -w_ji * c_ji are
    <= 0 for weights >= 0 (c_ji: d_j^-1/2 d_i^-1/2 for 'sym', 1 / d_j for 'rw', d the weighted
    out-degree without self loops); so L^ = L - I: no self-loop term, and the off-diagonal
    entries unscaled. A negative weight could make an entry the maximum, a global statistic, so
    it is refused (`message_scale`). The propagation drops the graph's self loops (policy
    "remove", as get_laplacian does) and reads the statistic `laplacian_degree` (the source
    index's weighted degree: an out-degree, which the engine prepares like the in-degrees).

    Rows: the first hop reads x = T_0 and, unless last, writes [T_1 | T_0 | out]; hop k reads
    [T_{k-1} | T_{k-2} | out] and writes [T_k | T_{k-1} | out]; the last writes out + b alone.
    Only T_{k-1} (the first `width` columns) travels; the rest stays with the vertex."""

    def __init__(
        self,
        width: int,
        out_dim: int,
        first: bool,
        last: bool,
        normalization: str = "sym",
        use_edge_weight: bool = True,
        bias: bool = True,
    ):
        if normalization not in CHEB_NORMALIZATIONS:
            raise ValueError(f"cheb_round: normalization must be one of {CHEB_NORMALIZATIONS}, got {normalization!r}")
        super().__init__(width, 0 if first else int(width) + int(out_dim), True, False, use_edge_weight)
        self.sum_dim = int(out_dim)
        self.normalization = normalization
        self.first, self.last = bool(first), bool(last)
        self.required_stats = (LAPLACIAN_DEGREE,)
        self.self_loops = "remove"
        self.out_dim = self.sum_dim if self.last else 2 * self.width + self.sum_dim
        self.weight_0 = torch.nn.Parameter(torch.zeros(self.sum_dim, self.width)) if self.first else None
        self.weight_k = torch.nn.Parameter(torch.zeros(self.sum_dim, self.width))
        self.bias = torch.nn.Parameter(torch.zeros(self.sum_dim)) if bias and self.last else None

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "width": self.width,
            "out_dim": self.sum_dim,
            "first": self.first,
            "last": self.last,
            "normalization": self.normalization,
            "use_edge_weight": self.uses_edge_weight,
            "bias": self.bias is not None,
        }

    def _source_scale(self, stats: dict) -> Tensor:
        deg = stats[LAPLACIAN_DEGREE].to(torch.float32)
        scale = deg.pow(-0.5) if self.normalization == "sym" else 1.0 / deg
        return scale.masked_fill(scale == float("inf"), 0.0)

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        x = h[:, : self.width] if self.carry else h
        return x * self._source_scale(stats).unsqueeze(-1)

    def message_scale(self, weight_e, pre_transform):
        if weight_e is not None and self.uses_edge_weight and bool((weight_e < 0).any()):
            raise ValueError(
                "ChebConv with a negative edge weight: PyG's lambda_max (2 x the Laplacian's largest "
                "entry) then depends on the whole graph; sparkgnn runs it for weights >= 0 only"
            )
        return super().message_scale(weight_e, pre_transform)

    def message(self, src_e, dst_e, weight_e, pre_transform):
        self.message_scale(weight_e, pre_transform)  # refuses negative weights
        return super().message(src_e, dst_e, weight_e, pre_transform)

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        if self.normalization == "sym":  # the destination's factor of d_j^-1/2 w_ji d_i^-1/2
            agg = agg * self._source_scale(stats).unsqueeze(-1)
        return self.combine(h_dst, -agg)

    def combine(self, h_dst: Tensor, x: Tensor) -> Tensor:
        if self.first:  # x = T_1 = L^ T_0
            t_prev, total = h_dst, F.linear(h_dst, cast(Tensor, self.weight_0))
            t_k = x
        else:  # x = L^ T_{k-1}; PyG: Tx_2 = 2. * Tx_2 - Tx_0
            w = self.width
            t_prev, t_before, total = h_dst[:, :w], h_dst[:, w : 2 * w], h_dst[:, 2 * w :]
            t_k = 2.0 * x - t_before
        total = total + F.linear(t_k, self.weight_k)
        if self.last:
            return total + self.bias if self.bias is not None else total
        return torch.cat([t_k, t_prev, total], dim=1)


@register_conv("cheb")
class ChebLayer(MultiRoundConv):
    """ChebConv(in_dim, out_dim, K, normalization 'sym' | 'rw', bias) with lambda_max None as K - 1
    ChebRounds (HopRound; ChebRound says why lambda_max is 2). K >= 2: K = 1 propagates nothing."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        K: int,
        normalization: str = "sym",
        bias: bool = True,
        use_edge_weight: bool = True,
    ):
        super().__init__()
        if int(K) < 2:
            raise ValueError(f"cheb: K must be >= 2 (K=1 is a Linear), got {K}")
        if normalization not in CHEB_NORMALIZATIONS:
            raise ValueError(f"cheb: normalization must be one of {CHEB_NORMALIZATIONS}, got {normalization!r}")
        self.in_dim, self.out_dim, self.K = int(in_dim), int(out_dim), int(K)
        self.normalization, self.has_bias = normalization, bool(bias)
        self.uses_edge_weight = bool(use_edge_weight)
        self.aggregator = get_aggregator("sum")
        self.steps = torch.nn.ModuleList(
            ChebRound(
                self.in_dim,
                self.out_dim,
                first=k == 1,
                last=k == self.K - 1,
                normalization=normalization,
                use_edge_weight=self.uses_edge_weight,
                bias=self.has_bias,
            )
            for k in range(1, self.K)
        )
        first = self.cheb_rounds()[0]
        self.required_stats, self.self_loops = first.required_stats, first.self_loops

    def cheb_rounds(self) -> list[ChebRound]:
        return [cast(ChebRound, s) for s in self.steps]

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "K": self.K,
            "normalization": self.normalization,
            "bias": self.has_bias,
            "use_edge_weight": self.uses_edge_weight,
        }
