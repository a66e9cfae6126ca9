"""PNAConv (Corso et al., "Principal Neighbourhood Aggregation") as a mergeable layer; matches
torch_geometric.nn.PNAConv in eval: per tower t (x_t the tower's slice of x with divide_input,
else x itself),

    m_ji^t = pre_t([x_i^t | x_j^t | enc(e_ji)])        enc = edge_encoder, only with edge_dim
    a_i^t  = [s(d_i) * AGG_k({m_ji^t}) for s in scalers for k in aggregators]
    out_i  = lin(concat_t post_t([x_i^t | a_i^t]))

with d_i the in-degree of i and the scalers identity (1), amplification (log(d+1) / avg_log),
attenuation (avg_log / log(max(d, 1) + 1)), linear (d / avg_lin) and inverse_linear
(avg_lin / max(d, 1)); avg_lin and avg_log are the degree-histogram averages PNA was built with
(kept as they were, trained or not).

WHY mergeable: the aggregators (mean, min, max, sum, var, std) each keep a partial state that
merges exactly (aggregators.py); `MultiAggregator` packs them side by side into one state row, so
one pass over a destination's in-edges serves them all. The scalers read only the destination's
in-degree, which the engine computes once per graph like GCN's degree and joins onto node rows
(the statistic "weighted_in_degree" of a conv that uses no edge weights: every in-edge counts 1,
self loops and parallel edges included, as PyG's degree(index) counts them), so they and the
post towers run in `update`. The message
reads the destination's row (`needs_dst_in_message`): pre_t is applied per edge in `message`, with
the edge's attributes travelling with the edge (`edge_attr_dim`). No self loops are added.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparkgnn.layers.aggregators import Aggregator, get_aggregator, register
from sparkgnn.layers.base import MergeableConv, register_conv
from sparkgnn.layers.nodeops import NodeOpStack

PNA_AGGRS = ("mean", "min", "max", "sum", "var", "std")
#: the node statistic the degree scalers read (layers/stats.py)
DEGREE = "weighted_in_degree"
PNA_SCALERS = ("identity", "amplification", "attenuation", "linear", "inverse_linear")


@register("multi")
class MultiAggregator(Aggregator):
    """Several one-pass aggregators over the same messages (PyG's MultiAggregation, mode 'cat'):
    the state is their states side by side, each merged by its own rule, and finalize gives their
    results concatenated in the order named ([AGG_1(m) | AGG_2(m) | ...])."""

    def __init__(self, names: list[str] | tuple[str, ...] = ("mean",)) -> None:
        self.names = [str(n) for n in names]
        if not self.names:
            raise ValueError("multi: name at least one aggregator")
        self.parts = [get_aggregator(n) for n in self.names]
        for name, part in zip(self.names, self.parts, strict=True):
            if part.phases != 1 or name in ("softmax", "multi"):
                raise ValueError(f"multi: aggregator {name!r} cannot be combined (one-pass column reductions only)")
        self.invertible = all(part.invertible for part in self.parts)

    def config(self) -> dict:
        return {"names": list(self.names)}

    def _widths(self, msg_width: int) -> list[int]:
        return [part.state_width(msg_width) for part in self.parts]

    def state_width(self, msg_width: int) -> int:
        return sum(self._widths(msg_width))

    def out_width(self, msg_width: int) -> int:
        return sum(part.out_width(msg_width) for part in self.parts)

    def _msg_width(self, state_width: int) -> int:
        # every part's state width is affine in the message width (a * w + b): invert the sum
        slope = self.state_width(2) - self.state_width(1)
        w, rest = divmod(state_width - (self.state_width(1) - slope), slope)
        if rest or w < 1:
            raise ValueError(f"multi: state width {state_width} matches no message width")
        return w

    def _split(self, state: Tensor) -> list[Tensor]:
        return list(torch.split(state, self._widths(self._msg_width(state.shape[1])), dim=1))

    def identity(self, num: int, msg_width: int, device=None) -> Tensor:
        return torch.cat([part.identity(num, msg_width, device) for part in self.parts], dim=1)

    def partial(self, m: Tensor, index: Tensor, num: int) -> Tensor:
        return torch.cat([part.partial(m, index, num) for part in self.parts], dim=1)

    def merge(self, states: Tensor, index: Tensor, num: int) -> Tensor:
        pieces = self._split(states)
        return torch.cat([part.merge(s, index, num) for part, s in zip(self.parts, pieces, strict=True)], dim=1)

    def negate(self, state: Tensor) -> Tensor:
        if not self.invertible:
            return super().negate(state)
        return torch.cat([part.negate(s) for part, s in zip(self.parts, self._split(state), strict=True)], dim=1)

    def finalize(self, state: Tensor) -> Tensor:
        pieces = self._split(state)
        return torch.cat([part.finalize(s) for part, s in zip(self.parts, pieces, strict=True)], dim=1)


def _stack_config(nn: torch.nn.Module) -> list:
    """The JSON config of one tower's node-op stack."""
    assert isinstance(nn, NodeOpStack)  # every tower is built as one
    return nn.config()


@register_conv("pna")
class PNALayer(MergeableConv):
    avg_deg_lin: Tensor
    avg_deg_log: Tensor
    # update reads h_dst[i], agg[i] and stats[i] only (layers/rowwise.py)
    row_wise = True

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        aggregators: list[str],
        scalers: list[str],
        pre_nns: list[list],
        post_nns: list[list],
        towers: int = 1,
        divide_input: bool = False,
        edge_dim: int | None = None,
    ):
        super().__init__()
        self.in_dim, self.out_dim, self.towers = int(in_dim), int(out_dim), int(towers)
        self.divide_input = bool(divide_input)
        if min(self.in_dim, self.out_dim, self.towers) < 1 or self.out_dim % self.towers:
            raise ValueError(f"pna: out_dim {out_dim} must be a positive multiple of towers {towers}")
        if self.divide_input and self.in_dim % self.towers:
            raise ValueError(f"pna: divide_input needs in_dim {in_dim} to be a multiple of towers {towers}")
        bad = [a for a in aggregators if a not in PNA_AGGRS] + [s for s in scalers if s not in PNA_SCALERS]
        if bad or not aggregators or not scalers:
            raise ValueError(f"pna: aggregators from {PNA_AGGRS} and scalers from {PNA_SCALERS}, got {bad or 'none'}")
        if len(pre_nns) != self.towers or len(post_nns) != self.towers:
            raise ValueError(f"pna: one pre and one post stack per tower ({self.towers})")
        if edge_dim is not None and int(edge_dim) < 1:
            raise ValueError(f"pna: edge_dim must be >= 1 (or None), got {edge_dim}")
        self.aggregators, self.scalers = [str(a) for a in aggregators], [str(s) for s in scalers]
        self.f_in = self.in_dim // self.towers if self.divide_input else self.in_dim
        self.f_out = self.out_dim // self.towers
        self.edge_dim = None if edge_dim is None else int(edge_dim)
        self.edge_attr_dim = self.edge_dim or 0
        self.edge_encoder = torch.nn.Linear(self.edge_dim, self.f_in) if self.edge_dim else None
        self.pre_nns = torch.nn.ModuleList(NodeOpStack(c) for c in pre_nns)
        self.post_nns = torch.nn.ModuleList(NodeOpStack(c) for c in post_nns)
        self.lin = torch.nn.Linear(self.out_dim, self.out_dim)
        self.register_buffer("avg_deg_lin", torch.ones(1))
        self.register_buffer("avg_deg_log", torch.ones(1))
        self.aggregator = MultiAggregator(self.aggregators)
        self.needs_dst_in_message = True
        # the unweighted in-degree (uses_edge_weight is False): a statistic every prepared layout carries
        self.required_stats = (DEGREE,) if set(self.scalers) - {"identity"} else ()

    def config(self) -> dict:
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "aggregators": list(self.aggregators),
            "scalers": list(self.scalers),
            "pre_nns": [_stack_config(nn) for nn in self.pre_nns],
            "post_nns": [_stack_config(nn) for nn in self.post_nns],
            "towers": self.towers,
            "divide_input": self.divide_input,
            "edge_dim": self.edge_dim,
        }

    def src_width(self, pre_transform: bool) -> int:
        return self.in_dim

    def dst_width(self) -> int:
        return self.in_dim

    def msg_width(self, pre_transform: bool) -> int:
        return self.towers * self.f_in

    def prepare_src(self, h: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        return h

    def prepare_dst(self, h: Tensor, stats: dict) -> Tensor:
        return h

    def _tower(self, x: Tensor, t: int) -> Tensor:
        """Tower t's slice of the rows (the rows themselves without divide_input)."""
        return x[:, t * self.f_in : (t + 1) * self.f_in] if self.divide_input else x

    def message(self, src_e: Tensor, dst_e: Tensor | None, weight_e: Tensor | None, pre_transform: bool) -> Tensor:
        if dst_e is None:
            raise ValueError("pna: the message needs the destination payload (its row)")
        edge = None
        if self.edge_encoder is not None:
            if weight_e is None or weight_e.dim() != 2:
                raise ValueError(f"pna: the message needs the edge attributes [E, {self.edge_attr_dim}]")
            edge = self.edge_encoder(weight_e)
        outs = []
        for t, nn in enumerate(self.pre_nns):
            parts = [self._tower(dst_e, t), self._tower(src_e, t)] + ([edge] if edge is not None else [])
            outs.append(nn(torch.cat(parts, dim=-1)))
        return torch.cat(outs, dim=1)

    def _scaled(self, out: Tensor, stats: dict) -> Tensor:
        """PyG's DegreeScalerAggregation: each scaler applied to the aggregate, concatenated."""
        if not self.required_stats:  # identity only
            return torch.cat([out] * len(self.scalers), dim=-1) if len(self.scalers) > 1 else out
        deg = stats[DEGREE].to(out.dtype).view(-1, 1, 1)
        outs = []
        for scaler in self.scalers:
            if scaler == "identity":
                outs.append(out)
            elif scaler == "amplification":
                outs.append(out * (torch.log(deg + 1) / self.avg_deg_log))
            elif scaler == "attenuation":
                outs.append(out * (self.avg_deg_log / torch.log(deg.clamp(min=1) + 1)))
            elif scaler == "linear":
                outs.append(out * (deg / self.avg_deg_lin))
            else:  # inverse_linear
                outs.append(out * (self.avg_deg_lin / deg.clamp(min=1)))
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]

    def update(self, h_dst: Tensor, agg: Tensor, stats: dict, pre_transform: bool) -> Tensor:
        n, a = agg.shape[0], len(self.aggregators)
        # [AGG_1 | AGG_2 | ...] each over the towers' messages -> PyG's [N, T, A * F_in]
        agg = agg.view(n, a, self.towers, self.f_in).transpose(1, 2).reshape(n, self.towers, a * self.f_in)
        x = h_dst.view(n, self.towers, self.f_in) if self.divide_input else h_dst.view(n, 1, -1)
        x = x.expand(n, self.towers, self.f_in)
        out = torch.cat([x, self._scaled(agg, stats)], dim=-1)
        out = torch.cat([nn(out[:, t]) for t, nn in enumerate(self.post_nns)], dim=1)
        return self.lin(out)
