"""The normalized-moments aggregator (OMEGA section 6.2) and its one-pass building block.

Why a module of its own: it is the only aggregator with two passes (`phases`): the mean of a
destination's messages first, then the centred moments ((1/N) sum (m - mean)^n)^(1/n) given that
mean, which the engine ships to the in-edges between the passes (layers/phases.py expands the layer
into two rounds; the second reads the mean as its destination payload: OMEGA's AllGather). The
one-pass aggregators and the interface are in aggregators.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparkgnn.layers.aggregators import (
    AdditiveAggregator,
    Aggregator,
    MeanAggregator,
    as_f32,
    mean_of,
    ones_col,
    register,
)


def _orders(n, minimum: int) -> list[int]:
    """Moment orders as a list of ints >= minimum: one int, or a list/tuple of them (one output
    block per order). bool and non-integral floats are refused: a fractional order of a signed
    value has no real root."""
    values = list(n) if isinstance(n, (list, tuple)) else [n]
    if not values:
        raise ValueError("moment orders: need at least one order")
    out = []
    for v in values:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, float) and v.is_integer())):
            raise ValueError(f"moment order must be an integer >= {minimum}, got {v!r}")
        if int(v) < minimum:
            raise ValueError(f"moment order must be an integer >= {minimum}, got {v!r}")
        out.append(int(v))
    return out


def _signed_root(s: Tensor, n: int) -> Tensor:
    """The real n-th root: sign(s) * |s|^(1/n). For even n the mean of x^n is >= 0 and this is
    the plain root; for odd n a negative mean keeps its sign (pow(negative, 1/n) would be NaN)."""
    return torch.sign(s) * s.abs().pow(1.0 / n)


@register("rawmoment")
class RawMomentAggregator(AdditiveAggregator):
    """Root of the n-th moment about zero, sign(s) * |s|^(1/n) with s = (1/|N|) sum x^n, per
    order n (`n` an int or a list: one block of msg_width columns per order, in list order).
    State [sum x^n_0 | sum x^n_1 | ... | count]: power sums add across partitions and the root is
    taken once, in finalize (OMEGA §6.2, like the power mean). Empty rows finalize to 0.

    On its own it is the moment about zero; fed centred messages m - mean it is the second pass
    of the normalized moments aggregator ("moments")."""

    def __init__(self, n: int | list[int] = 2) -> None:
        self.orders = _orders(n, 1)
        self.n = list(self.orders) if isinstance(n, (list, tuple)) else self.orders[0]

    def config(self):
        return {"n": self.n}

    def state_width(self, msg_width):
        return len(self.orders) * msg_width + 1

    def out_width(self, msg_width):
        return len(self.orders) * msg_width

    def _parts(self, m):
        return [m.pow(k) for k in self.orders] + [ones_col(m)]

    def finalize(self, state):
        f = (state.shape[1] - 1) // len(self.orders)
        count = state[:, -1:]
        blocks = [_signed_root(mean_of(state[:, i * f : (i + 1) * f], count), k) for i, k in enumerate(self.orders)]
        return torch.cat(blocks, dim=1)


@register("moments")
class MomentsAggregator(Aggregator):
    """Normalized (centred) moments ((1/|N|) sum_u (m_u - mbar)^n)^(1/n), mbar the mean of the
    destination's messages (OMEGA §6.2), the root taken as sign(s) * |s|^(1/n) (real root, so odd
    orders keep the sign of the skew). `n`: an int >= 2 or a list of them (one block of msg_width
    columns per order). A node without in-edges gives 0, like PyG's other aggregators.

    WHY two passes: the centred terms need mbar, which is known only once every partition's
    partial sums of the destination have been merged. Pass 0 is the mean aggregator
    ([sum m | count], merged by addition); the executor then gathers each destination's mean to
    the partitions holding its in-edges (OMEGA's AllGather); pass 1 is `rawmoment` over the
    centred messages m - mbar ([sum (m - mbar)^n | count], merged by addition, rooted once).
    Expanding (E[m^n] about zero into centred terms) in one pass would lose the exactness the
    other aggregators have: it subtracts large power sums (catastrophic cancellation in float32).

    The one-pass hooks (`partial`, `merge`) refuse: there is no single-pass state. The state of
    the aggregator as a whole (state_width, identity, finalize: what `aggregate_state` and the
    final update see) is its last pass's. Not invertible: a changed in-edge moves the mean and
    with it every centred term."""

    phases = 2

    def __init__(self, n: int | list[int] = 2) -> None:
        orders = _orders(n, 2)
        self.n = list(orders) if isinstance(n, (list, tuple)) else orders[0]
        self._passes: tuple[Aggregator, Aggregator] = (MeanAggregator(), RawMomentAggregator(self.n))

    def config(self):
        return {"n": self.n}

    def phase(self, p):
        if not 0 <= p < self.phases:
            raise ValueError(f"{self.name}: no pass {p} (phases={self.phases})")
        return self._passes[p]

    def phase_message(self, p, m, context_e):
        if p == 0:
            return m
        if context_e is None or context_e.shape != m.shape:
            got = None if context_e is None else tuple(context_e.shape)
            raise ValueError(
                f"moments pass {p} needs the destination means, shaped like the messages {tuple(m.shape)}, got {got}"
            )
        return as_f32(m) - as_f32(context_e)

    def _last(self) -> Aggregator:
        return self._passes[-1]

    def state_width(self, msg_width):
        return self._last().state_width(msg_width)

    def out_width(self, msg_width):
        return self._last().out_width(msg_width)

    def identity(self, num, msg_width, device=None):
        return self._last().identity(num, msg_width, device)

    _ONE_PASS = (
        "moments aggregates in two passes (mean, then centred powers): run pass p through phase(p) "
        "(layers.base.propagate does; Model expands the conv into one engine round per pass)"
    )

    def partial(self, m, index, num):
        raise NotImplementedError(self._ONE_PASS)

    def merge(self, states, index, num):
        raise NotImplementedError(self._ONE_PASS)

    def finalize(self, state):
        return self._last().finalize(state)
