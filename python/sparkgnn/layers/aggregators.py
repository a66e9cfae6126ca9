"""Mergeable aggregators: neighbourhood reductions split into partial -> merge -> finalize.

WHY this shape: a destination node's in-edges may sit in several partitions (combiner plans,
computation-graph parallelism in serving, incremental refresh of one node). Each partition
reduces its own edges to a fixed-width *state* per destination (`partial`); states from any
number of partitions are combined by an associative and commutative `merge`; `finalize` turns
the merged state into the value PyTorch Geometric's single-shot aggregation would have given.
Because `merge` is associative + commutative and has an identity, the result does not depend on
how edges were split or in which order partial states arrive (OMEGA §6.2).

States are float32 tensors *packed* into one row per destination (S floats), so the executor can
ship them as a fixed-width Arrow column without knowing what is inside. Counts are stored as
float32 (exact up to 2^24 in-edges per node).

Aggregators are chosen by name from `AGGREGATORS` (a registry, not if/elif chains), so adding one
is one class + one `@register` line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from sparkgnn.registry import Registry

AGGREGATORS: Registry[type[Aggregator]] = Registry("aggregator", ValueError)


AggregatorT = TypeVar("AggregatorT", bound="Aggregator")


def register(name: str) -> Callable[[type[AggregatorT]], type[AggregatorT]]:
    def deco(cls: type[AggregatorT]) -> type[AggregatorT]:
        cls.name = name
        return AGGREGATORS.register(name, cls)

    return deco


def get_aggregator(name: str, **kwargs) -> Aggregator:
    """Build an aggregator from its registry name and keyword options (see each class)."""
    return AGGREGATORS.lookup(name)(**kwargs)


def as_f32(t: Tensor) -> Tensor:
    """`t` as float32 (itself when it already is)."""
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def _check_index(index: Tensor, rows: int, num: int) -> Tensor:
    if index.dim() != 1 or index.numel() != rows:
        raise ValueError(f"index must be 1-D with {rows} entries, got shape {tuple(index.shape)}")
    index = index.to(torch.long)
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num):
        raise ValueError(f"index out of range [0, {num})")
    return index


def _scatter_add(src: Tensor, index: Tensor, num: int) -> Tensor:
    out = torch.zeros((num,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
    return out.index_add_(0, index, src)


def _scatter_extreme(src: Tensor, index: Tensor, num: int, reduce: str, fill: float) -> Tensor:
    out = torch.full((num,) + tuple(src.shape[1:]), fill, dtype=src.dtype, device=src.device)
    idx = index.view((-1,) + (1,) * (src.dim() - 1)).expand_as(src)
    return out.scatter_reduce_(0, idx, src, reduce=reduce, include_self=True)


class Aggregator:
    """Interface. `linear` is True when finalize(merge(partial(m))) is linear in m: a linear
    node transform can then be applied before propagation (transform-then-propagate) without
    changing the result, which lets the planner ship the narrower of the two widths."""

    name: str = ""
    linear: bool = False
    # True when a state can be UN-merged: merge(s, negate(p)) removes partial p from s. That is
    # what lets serving update a stored state when some in-edges' messages changed (subtract the
    # old messages, add the new ones); max/min/softmax cannot, they recompute the node instead.
    invertible: bool = False
    # True when every message column is reduced on its own by the same rule: aggregating [m1 | m2]
    # gives [agg m1 | agg m2], so two groups of a bundle with this aggregator (same options) fuse
    # into one (layers/bundle.py).
    column_wise: bool = False

    # Passes over a destination's in-edges. Pass p >= 1 needs, at every partition holding one of
    # the destination's in-edges, the finalized result of pass p - 1 for that destination (the
    # normalized moments need the mean before they can centre a message): a distributed executor
    # must gather that per-destination context to the edges between two passes (OMEGA §6.2's
    # AllGather). Each pass on its own is an ordinary single-pass aggregator (`phase(p)`), merged
    # exactly like every other one; `phase_message` forms its per-edge input from the layer's
    # message and the gathered context.
    phases: int = 1

    def phase(self, p: int) -> Aggregator:
        """The single-pass aggregator run in pass p (0 <= p < phases); one-pass aggregators are
        their own only pass."""
        if p != 0 or self.phases != 1:
            raise ValueError(f"{self.name}: no pass {p} (phases={self.phases})")
        return self

    def phase_message(self, p: int, m: Tensor, context_e: Tensor | None) -> Tensor:
        """Pass p's per-edge input: the layer's message m, and for p >= 1 `context_e`, the
        finalized result of pass p - 1 at each edge's destination (row-aligned with m). Must
        keep m's width (the pass reads it with the layer's msg_width), and return m unchanged for
        p == 0 (context_e None): an executor may form pass 0's input without this hook (sparse
        products over source payloads)."""
        return m

    def config(self) -> dict:
        """JSON-able keyword arguments that rebuild this aggregator via get_aggregator."""
        return {}

    def state_width(self, msg_width: int) -> int:
        raise NotImplementedError

    def out_width(self, msg_width: int) -> int:
        return msg_width

    def identity(self, num: int, msg_width: int, device=None) -> Tensor:
        """State of a destination that received no message (the merge identity)."""
        raise NotImplementedError

    def partial(self, m: Tensor, index: Tensor, num: int) -> Tensor:
        raise NotImplementedError

    def merge(self, states: Tensor, index: Tensor, num: int) -> Tensor:
        raise NotImplementedError

    # True when the state follows from per-destination message sums and edge counts (sum, mean):
    # an executor may then aggregate with a sparse matrix product instead of materialising one
    # message row per edge, and build the state with partial_from_sums.
    from_sums: bool = False

    def negate(self, state: Tensor) -> Tensor:
        """The inverse of a partial state under merge (only when `invertible`)."""
        raise NotImplementedError(f"{self.name}: states cannot be un-merged (not invertible)")

    def partial_from_sums(self, sums: Tensor, counts: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} state does not follow from sums and counts")

    def finalize(self, state: Tensor) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({opts})"


class AdditiveAggregator(Aggregator):
    """Aggregators whose state is a vector of sums (sum, mean, power mean, variance): merging is
    plain addition, so `merge` is shared and exact up to float32 summation order, and a partial
    is removed by adding its negation (`invertible`)."""

    invertible = True

    def negate(self, state: Tensor) -> Tensor:
        return -as_f32(state)

    def _parts(self, m: Tensor) -> list[Tensor]:
        """Per-edge contributions to the state columns, in packed order."""
        raise NotImplementedError

    def identity(self, num: int, msg_width: int, device=None) -> Tensor:
        return torch.zeros(num, self.state_width(msg_width), dtype=torch.float32, device=device)

    def partial(self, m: Tensor, index: Tensor, num: int) -> Tensor:
        """Each part scattered on its own and the [num, ...] sums concatenated. WHY not the parts
        concatenated per edge first: that copies every message once more ([E, state] floats), as
        much work as the scatter itself; the sums are the same, added in the same order."""
        m = as_f32(m)
        index = _check_index(index, m.shape[0], num)
        sums = [_scatter_add(part, index, num) for part in self._parts(m)]
        return sums[0] if len(sums) == 1 else torch.cat(sums, dim=1)

    def merge(self, states: Tensor, index: Tensor, num: int) -> Tensor:
        states = as_f32(states)
        index = _check_index(index, states.shape[0], num)
        return _scatter_add(states, index, num)


def ones_col(m: Tensor) -> Tensor:
    """A float32 column of ones, one per row of `m` (the count a message adds to its row)."""
    return torch.ones(m.shape[0], 1, dtype=torch.float32, device=m.device)


def mean_of(sums: Tensor, count: Tensor) -> Tensor:
    """Row means from sums and counts, PyG's scatter(reduce='mean') arithmetic: sum / count.clamp(min=1),
    so an empty row's mean is 0."""
    return sums / count.clamp(min=1)


@register("sum")
class SumAggregator(AdditiveAggregator):
    """State [s]."""

    linear = True
    column_wise = True

    def state_width(self, msg_width: int) -> int:
        return msg_width

    def _parts(self, m):
        return [m]

    from_sums = True

    def partial_from_sums(self, sums, counts):
        return as_f32(sums)

    def finalize(self, state):
        return state


@register("mean")
class MeanAggregator(AdditiveAggregator):
    """State [s | n]: the count travels with the sum because a mean of means is not the mean."""

    linear = True
    column_wise = True

    def state_width(self, msg_width: int) -> int:
        return msg_width + 1

    def _parts(self, m):
        return [m, ones_col(m)]

    from_sums = True

    def partial_from_sums(self, sums, counts):
        return torch.cat([as_f32(sums), as_f32(counts).unsqueeze(-1)], dim=1)

    def finalize(self, state):
        return mean_of(state[:, :-1], state[:, -1:])


class _Extreme(Aggregator):
    """State [m] with identity -inf (max) / +inf (min); finalize maps untouched rows to 0, which
    is what PyG's scatter max/min gives a node without in-edges."""

    reduce = ""
    fill = 0.0
    column_wise = True

    def state_width(self, msg_width: int) -> int:
        return msg_width

    def identity(self, num, msg_width, device=None):
        return torch.full((num, msg_width), self.fill, dtype=torch.float32, device=device)

    def partial(self, m, index, num):
        m = as_f32(m)
        index = _check_index(index, m.shape[0], num)
        return _scatter_extreme(m, index, num, self.reduce, self.fill)

    def merge(self, states, index, num):
        return self.partial(states, index, num)

    def finalize(self, state):
        return state.masked_fill(state == self.fill, 0.0)


@register("max")
class MaxAggregator(_Extreme):
    reduce, fill = "amax", -math.inf


@register("min")
class MinAggregator(_Extreme):
    reduce, fill = "amin", math.inf


def _as_exponent(p, device=None):
    """PyG keeps p as a Python number (fixed) or a Parameter (learn=True); the float32 tensor
    form and the Python-float form round differently in pow(), so we mirror whichever PyG used."""
    if isinstance(p, (list, tuple)):
        return torch.tensor(p, dtype=torch.float32, device=device).view(1, -1)
    return float(p)


@register("powermean")
class PowerMeanAggregator(AdditiveAggregator):
    """Power mean ((1/n) sum clamp(x)^p)^(1/p), state [sum clamp(x)^p | n] (OMEGA §6.2: power
    sums add across partitions; the 1/p root is applied once, in finalize).

    Matches PyG PowerMeanAggregation: the clamp to [clamp_min, clamp_max] is applied before pow(p)
    and again before pow(1/p), and skipped entirely when p is the fixed number 1 (`transform` is
    False then). A learnable p (a tensor in PyG, possibly per channel) is given as a list.
    Empty rows finalize to clamp_min**(1/p), exactly like PyG (mean 0, then clamped)."""

    def __init__(
        self, p=1.0, clamp_min: float | None = 1e-4, clamp_max: float | None = 100.0, transform: bool | None = None
    ):
        if isinstance(p, (list, tuple)):
            p = [float(v) for v in p]
        else:
            p = float(p)
        self.p = p
        self.clamp_min = None if clamp_min is None else float(clamp_min)
        self.clamp_max = None if clamp_max is None else float(clamp_max)
        self.transform = bool(isinstance(p, list) or p != 1) if transform is None else bool(transform)
        self.linear = not self.transform
        self.column_wise = not isinstance(p, list)  # a per-channel exponent is tied to one width

    def config(self):
        return {"p": self.p, "clamp_min": self.clamp_min, "clamp_max": self.clamp_max, "transform": self.transform}

    def state_width(self, msg_width):
        return msg_width + 1

    def _parts(self, m):
        if self.transform:
            p = _as_exponent(self.p, m.device)
            m = m.clamp(min=self.clamp_min, max=self.clamp_max).pow(p)
        return [m, ones_col(m)]

    def finalize(self, state):
        out = mean_of(state[:, :-1], state[:, -1:])
        if self.transform:
            p = _as_exponent(self.p, out.device)
            out = out.clamp(min=self.clamp_min, max=self.clamp_max).pow(1.0 / p)
        return out


@register("var")
class VarAggregator(AdditiveAggregator):
    """Variance mean(x^2) - mean(x)^2 with state [sum x | sum x^2 | n] (PyG VarAggregation's
    formula; the raw power sums are what adds across partitions, so no second pass over the
    edges is needed)."""

    column_wise = True

    def state_width(self, msg_width):
        return 2 * msg_width + 1

    def _parts(self, m):
        return [m, m * m, ones_col(m)]

    def finalize(self, state):
        f = (state.shape[1] - 1) // 2
        n = state[:, -1:]
        mean = mean_of(state[:, :f], n)
        mean2 = mean_of(state[:, f : 2 * f], n)
        return mean2 - mean * mean


@register("std")
class StdAggregator(VarAggregator):
    """sqrt(var) with PyG StdAggregation's guard: clamp(min=1e-5).sqrt(), values <= sqrt(1e-5)
    set to 0."""

    def finalize(self, state):
        out = super().finalize(state).clamp(min=1e-5).sqrt()
        return out.masked_fill(out <= math.sqrt(1e-5), 0.0)


@register("softmax")
class SoftmaxAggregator(Aggregator):
    """Attention-weighted sum (GAT; also PyG SoftmaxAggregation with heads = channels, C = 1).

    Message per edge: [logit (H) | value (H*C)]. State per destination and head:
    [max logit (H) | sum exp(logit - max) (H) | sum exp(logit - max) * value (H*C)].
    Two partial states with maxima m1, m2 merge by rescaling each by exp(m_i - max(m1, m2))
    before adding (OMEGA §6.2, the flash-attention trick): this keeps exp() from overflowing and
    is exactly associative in real arithmetic. finalize = value_sum / (exp_sum + 1e-16), the
    same epsilon as torch_geometric.utils.softmax, and 0 for rows without messages."""

    def __init__(self, heads: int = 1):
        if int(heads) < 1:
            raise ValueError("heads must be >= 1")
        self.heads = int(heads)

    def config(self):
        return {"heads": self.heads}

    def _channels(self, msg_width: int) -> int:
        h = self.heads
        if msg_width <= h or (msg_width - h) % h:
            raise ValueError(f"softmax message width {msg_width} is not heads + heads*C (heads={h})")
        return (msg_width - h) // h

    def state_width(self, msg_width):
        return msg_width + self.heads

    def out_width(self, msg_width):
        return msg_width - self.heads

    def identity(self, num, msg_width, device=None):
        h = self.heads
        out = torch.zeros(num, self.state_width(msg_width), dtype=torch.float32, device=device)
        out[:, :h] = -math.inf
        return out

    def _combine(self, mx_rows: Tensor, weight_rows: Tensor, value_rows: Tensor, index: Tensor, num: int) -> Tensor:
        """Shared by partial and merge: rows carry (max, weight, value) relative to their own
        max; rescale to the destination's global max and add."""
        h = self.heads
        rows = mx_rows.shape[0]
        c = value_rows.shape[1] // h
        mx = _scatter_extreme(mx_rows, index, num, "amax", -math.inf)
        scale = torch.exp(mx_rows - mx.index_select(0, index))
        scale = scale.masked_fill(mx_rows == -math.inf, 0.0)  # identity rows contribute nothing
        s = _scatter_add(weight_rows * scale, index, num)
        v = _scatter_add((value_rows.view(rows, h, c) * scale.unsqueeze(-1)).view(rows, h * c), index, num)
        return torch.cat([mx, s, v], dim=1)

    def partial(self, m, index, num):
        m = as_f32(m)
        h = self.heads
        self._channels(m.shape[1])
        index = _check_index(index, m.shape[0], num)
        logit = m[:, :h]
        return self._combine(logit, torch.ones_like(logit), m[:, h:], index, num)

    def merge(self, states, index, num):
        states = as_f32(states)
        h = self.heads
        index = _check_index(index, states.shape[0], num)
        return self._combine(states[:, :h], states[:, h : 2 * h], states[:, 2 * h :], index, num)

    def finalize(self, state):
        h = self.heads
        n = state.shape[0]
        v = state[:, 2 * h :]
        c = v.shape[1] // h
        out = v.view(n, h, c) / (state[:, h : 2 * h] + 1e-16).unsqueeze(-1)
        return out.reshape(n, h * c)


@register("softmax_state")
class SoftmaxStateAggregator(SoftmaxAggregator):
    """The softmax aggregator's merged state itself as the result: [max logit (H) | sum exp (H) |
    weighted value sum (H*C)], not yet divided. For a layer whose softmax spans more than one
    propagation (HGT: one softmax over a node's in-edges of every relation into its type), each
    propagation gives this state and the caller merges the states further (layers/hetero.py's
    softmax relation aggregation) before dividing. A row without messages has the lowest float32
    as its max instead of -inf, so states stay finite wherever they travel and still merge
    exactly: exp(lowest - m) is 0 next to any real logit m, and 1 times a zero sum next to
    another empty row."""

    def out_width(self, msg_width):
        return self.state_width(msg_width)

    def finalize(self, state):
        h = self.heads
        mx = state[:, :h]
        return torch.cat([mx.clamp_min(torch.finfo(torch.float32).min), state[:, h:]], dim=1)


__all__: Sequence[str] = ["AGGREGATORS", "Aggregator", "get_aggregator", "register"]
