"""One engine round per pass of a multi-pass aggregator.

An engine round (a dataflow step of the executor, a layer of serving's computation graph, a PE
store layer) runs exactly one pass over the in-edges: payloads to edges, messages, partial states,
merge, finalize, update. A layer whose aggregator needs several passes (Aggregator.phases > 1, the
normalized moments: the mean, then the centred powers) is therefore run as one round per pass,
each an ordinary single-pass MergeableConv, so every executor, strategy and the planner handle it
with no code of their own:

    round p < last   aggregator phase(p); update  -> [h | r_p]      (r_p: pass p's finalized result)
    round p >= 1     destination payload r_{p-1}  (needs_dst_in_message: OMEGA's AllGather of the
                     previous pass's per-destination result to every partition holding an in-edge)
                     message = aggregator.phase_message(p, layer message, r_{p-1} at the dst)
    last round       update = the layer's own update on h and the last pass's result

The row h rides along through the earlier rounds (their update appends r_p to it) because the
layer's messages and update read it; the post ops of the layer follow its last round, the earlier
rounds have none (Model does the expansion: expand_passes).

Rounds always ship raw payloads (no transform-then-propagate): a multi-pass aggregation is not
linear in the messages, so the layer could not pre-transform anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.multihop import MultiRoundConv


class PassRound(MergeableConv):
    """Pass `phase` of `layer`'s aggregator as a round of its own (module doc). The layer (and
    its weights) is a registered submodule of its LAST round only; the earlier rounds use the
    same object without registering it, so its parameters appear once in a state_dict."""

    # update is cat([h, r]) or the layer's own update (checked row-wise as a submodule)
    row_wise = True

    def __init__(self, layer: MergeableConv, phase: int):
        super().__init__()
        agg = layer.aggregator
        if not 0 <= phase < agg.phases:
            raise ValueError(f"{layer.kind}: aggregator {agg.name} has no pass {phase} (phases={agg.phases})")
        self.phase, self.last = int(phase), phase == agg.phases - 1
        self.passes = agg  # the layer's multi-pass aggregator (phase_message lives there)
        self.aggregator = agg.phase(phase)
        self.kind = f"{layer.kind}.{agg.name}[{phase + 1}/{agg.phases}]"
        if self.last:
            self.layer = layer
        else:
            self._held = (layer,)  # a tuple: torch does not register it as a submodule
        msg = layer.msg_width(False)
        self._msg = msg
        self._context = agg.phase(phase - 1).out_width(msg) if phase else 0
        self.in_dim = layer.in_dim + self._context
        self.out_dim = layer.out_dim if self.last else layer.in_dim + self.aggregator.out_width(msg)
        self.self_loops = layer.self_loops
        self.uses_edge_weight = layer.uses_edge_weight
        self.required_stats = tuple(layer.required_stats)
        self.needs_dst_in_message = bool(layer.needs_dst_in_message or phase > 0)
        self.can_pre_transform = False

    @property
    def wrapped(self) -> MergeableConv:
        return self.layer if self.last else self._held[0]

    def config(self) -> dict:
        """Descriptive only: rounds are never in a spec (Model rebuilds them from the layer's)."""
        return {"kind": "pass_round", "phase": self.phase, "layer": self.wrapped.config()}

    # -- widths ------------------------------------------------------------------------------
    def src_width(self, pre_transform):
        return self.wrapped.src_width(False)

    def msg_width(self, pre_transform):
        return self._msg

    def dst_width(self):
        return self.wrapped.dst_width() + self._context

    # -- the contract -----------------------------------------------------------------------
    def _h(self, h: Tensor) -> Tensor:
        return h[:, : self.wrapped.in_dim]

    def prepare_src(self, h, stats, pre_transform):
        return self.wrapped.prepare_src(self._h(h), stats, False)

    def prepare_dst(self, h, stats):
        """The layer's own destination payload (if any), then the previous pass's result."""
        blocks: list[Tensor] = []
        if self.wrapped.dst_width():
            own = self.wrapped.prepare_dst(self._h(h), stats)
            assert own is not None, "a layer with a destination width prepares a destination payload"
            blocks.append(own)
        if self._context:
            blocks.append(h[:, self.wrapped.in_dim :])
        return torch.cat(blocks, dim=1) if blocks else None

    def message(self, src_e, dst_e, weight_e, pre_transform):
        own = self.wrapped.dst_width()
        layer_dst = dst_e[:, :own] if own and dst_e is not None else None
        m = self.wrapped.message(src_e, layer_dst, weight_e, False)
        if not self.phase:
            return m
        return self.passes.phase_message(self.phase, m, dst_e[:, own:])

    def message_scale(self, weight_e, pre_transform):
        # pass 0 reads the layer's message unchanged (Aggregator.phase_message); later passes
        # centre it on a destination payload, which no sparse product can do
        return self.wrapped.message_scale(weight_e, False) if not self.phase else (False, None)

    def update(self, h_dst, agg, stats, pre_transform):
        if self.last:
            return self.wrapped.update(self._h(h_dst), agg, stats, False)
        return torch.cat([self._h(h_dst), agg.to(h_dst.dtype)], dim=1)


def expand_passes(layer: MergeableConv) -> list[MergeableConv]:
    """The engine rounds of a layer: a multi-hop layer's own rounds (layers/multihop.py), else
    itself when its aggregator takes one pass, else one PassRound per pass (module doc)."""
    if isinstance(layer, MultiRoundConv):
        return layer.rounds()
    if layer.aggregator.phases == 1:
        return [layer]
    return [PassRound(layer, p) for p in range(layer.aggregator.phases)]
