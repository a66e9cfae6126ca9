"""BundleConv: k convolutions over one edge list, run as ONE mergeable layer (model batching).

Lotan's GNN model batching (../shared/papers/002, §5.2): several models over the same graph share
the data movement of a layer instead of each paying for it. The layer input is the k members'
inputs side by side (each member reads its own column slice); the layer output is the members'
outputs side by side. Because the bundle is an ordinary MergeableConv, the engine, the planner and
every strategy run it unchanged, and each member's columns are computed by the member's own code
on the member's own rows: batched results equal each model run alone.

What is shared (layers/signatures.py decides equality; unequal keys only cost sharing):
  payload groups      members reading the same input slice with the same prepare_src (raw rows of
                      SAGE / GIN / GAT, GCN's deg^-1/2 rows, or one transform with equal weights)
                      ship ONE payload block: two raw SAGE models at layer 1 ship x once.
  aggregation groups  members of one payload group with the same message and aggregator config
                      aggregate ONCE and read the same finalized aggregate in their update.
The composite message is the groups' messages side by side and the composite aggregator runs
each group's aggregator on its columns. Consecutive groups with the same column-wise aggregator
(sum, mean, max, ...) are ONE aggregation over their joint columns (a mean of [m1 | m2] is
[mean m1 | mean m2], one count column), so a bundle of mean layers IS a mean layer to the engine
(native pushdown aggregates, the sums path). A member with `conv` None passes its slice through:
it carries a model whose stack is shorter than the others'.

What cannot be shared: the edge list. The engine applies ONE self-loop policy and ONE edge-weight
choice per layer, so members must agree on `self_loops`, and a member needing a node statistic
must agree with the bundle on whether edge weights count in it; BundleConv refuses otherwise
(models/batching.py puts such models in separate batches).

Groups depend on the mode (transform-then-propagate changes payloads), so both modes' layouts are
kept; the composite aggregator tells them apart by width (ConcatAggregator), and a bundle whose two
layouts cannot be told apart that way runs raw only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from sparkgnn.layers.aggregators import Aggregator, get_aggregator, register
from sparkgnn.layers.base import MergeableConv, build_conv, register_conv
from sparkgnn.layers.nodeops import columns
from sparkgnn.layers.signatures import message_key, payload_key


def _agg_key(agg: Aggregator) -> tuple[str, str]:
    return agg.name, json.dumps(agg.config(), sort_keys=True)


@register("concat")
class ConcatAggregator(Aggregator):
    """Aggregators side by side: part i reduces message columns [o_i, o_i + w_i); states and
    finalized values are the parts' side by side. `layouts`: one list of parts per mode
    ({"name", "options", "width"} each); a call picks the layout by the width it is given (message
    width for partial / identity / state_width / partial_from_sums, state width for merge /
    finalize / negate), so the layouts' message widths and state widths must all differ."""

    def __init__(self, layouts: list):
        self.layouts = [[dict(part) for part in parts] for parts in layouts]
        self._parts = [
            [(get_aggregator(p["name"], **p.get("options", {})), int(p["width"])) for p in parts]
            for parts in self.layouts
        ]
        everything = [agg for parts in self._parts for agg, _ in parts]
        if not everything:
            raise ValueError("a concat aggregator needs at least one part")
        self.linear = all(agg.linear for agg in everything)
        self.invertible = all(agg.invertible for agg in everything)
        self.from_sums = all(agg.from_sums for agg in everything)
        self._by_msg = {sum(w for _, w in parts): parts for parts in self._parts}
        self._by_state = {sum(agg.state_width(w) for agg, w in parts): parts for parts in self._parts}
        if len(self._by_msg) != len(self._parts) or len(self._by_state) != len(self._parts):
            raise ValueError("concat aggregator layouts must differ in message and state width")

    def config(self):
        return {"layouts": self.layouts}

    def _msg_parts(self, width: int):
        try:
            return self._by_msg[int(width)]
        except KeyError:
            raise ValueError(
                f"concat aggregator: no layout has message width {width} ({sorted(self._by_msg)})"
            ) from None

    def _state_parts(self, width: int):
        try:
            return self._by_state[int(width)]
        except KeyError:
            raise ValueError(
                f"concat aggregator: no layout has state width {width} ({sorted(self._by_state)})"
            ) from None

    @staticmethod
    def _each(parts, width_of, tensor: Tensor, fn) -> Tensor:
        outs, start = [], 0
        for agg, w in parts:
            stop = start + width_of(agg, w)
            outs.append(fn(agg, w, tensor[:, start:stop]))
            start = stop
        return torch.cat(outs, dim=1)

    def state_width(self, msg_width):
        return sum(agg.state_width(w) for agg, w in self._msg_parts(msg_width))

    def out_width(self, msg_width):
        return sum(agg.out_width(w) for agg, w in self._msg_parts(msg_width))

    def identity(self, num, msg_width, device=None):
        parts = self._msg_parts(msg_width)
        return torch.cat([agg.identity(num, w, device) for agg, w in parts], dim=1)

    def partial(self, m, index, num):
        return self._each(self._msg_parts(m.shape[1]), lambda a, w: w, m, lambda a, w, t: a.partial(t, index, num))

    def partial_from_sums(self, sums, counts):
        parts = self._msg_parts(sums.shape[1])
        return self._each(parts, lambda a, w: w, sums, lambda a, w, t: a.partial_from_sums(t, counts))

    def _by_states(self, state: Tensor, fn) -> Tensor:
        return self._each(self._state_parts(state.shape[1]), lambda a, w: a.state_width(w), state, fn)

    def merge(self, states, index, num):
        return self._by_states(states, lambda a, w, t: a.merge(t, index, num))

    def negate(self, state):
        return self._by_states(state, lambda a, w, t: a.negate(t))

    def finalize(self, state):
        return self._by_states(state, lambda a, w, t: a.finalize(t))


@dataclass
class _Group:
    rep: int  # the member whose code computes the group's payload / message
    start: int  # columns of the payload (payload group) or message (aggregation group)
    stop: int
    out: tuple[int, int] = (0, 0)  # aggregation group: columns of its finalized aggregate
    payload: int = 0  # aggregation group: its payload group
    aggregator: Aggregator | None = None


@dataclass
class _Layout:
    """Groups of one mode (raw or transform-then-propagate), members in order."""

    payloads: list[_Group] = field(default_factory=list)
    aggs: list[_Group] = field(default_factory=list)
    member_agg: list[int | None] = field(default_factory=list)
    parts: list[dict] = field(default_factory=list)
    scaled: bool = False

    @property
    def src_width(self) -> int:
        return self.payloads[-1].stop

    @property
    def msg_width(self) -> int:
        return self.aggs[-1].stop


_PROBE_WEIGHT = torch.tensor([0.5])
MODES = ("raw", "pre_transform")


def share_ids(members: list[tuple[tuple[int, int], MergeableConv | None]], pre: bool) -> list:
    """[payload group, aggregation group] of each member (None: pass-through) in one mode, from the
    members' signatures over their current weights (layers/signatures.py): same input slice and
    payload key -> one payload group; same payload group, message key and aggregator -> one
    aggregation group. Groups are numbered in order of first use."""
    payloads: dict = {}
    aggs: dict = {}
    ids: list = []
    for span, conv in members:
        if conv is None:
            ids.append(None)
            continue
        p = payloads.setdefault((tuple(span), payload_key(conv, pre)), len(payloads))
        a = aggs.setdefault((p, message_key(conv, pre), _agg_key(conv.aggregator)), len(aggs))
        ids.append([p, a])
    return ids


def _fused_parts(aggs: list[_Group]) -> list[dict]:
    """The aggregator parts: consecutive groups with the same column-wise aggregator fuse."""
    parts: list[dict] = []
    for group in aggs:
        agg = group.aggregator
        assert agg is not None
        width = group.stop - group.start
        if parts and agg.column_wise and _agg_key(agg) == (parts[-1]["name"], _options(parts[-1])):
            parts[-1]["width"] += width
        else:
            parts.append({"name": agg.name, "options": agg.config(), "width": width})
    return parts


def _options(part: dict) -> str:
    return json.dumps(part["options"], sort_keys=True)


@register_conv("bundle")
class BundleConv(MergeableConv):
    """`members`: [{"input": [start, stop], "conv": conv config or None (pass-through)}]; see the
    module doc. Weights are the member convs' (state_dict names convs.<i>.*, i over real members).

    `share`: {"raw": ids, "pre_transform": ids}, ids[i] = [payload group, aggregation group] of
    member i (None for a pass-through), groups numbered in order of first use. WHY in the config:
    whether two members compute the same payload depends on their weights, which a model being
    loaded does not have yet (it is built from its spec, then its state_dict is loaded); so the
    sharing is decided once, from the real weights, by `from_convs`, and saved with the spec (the
    fingerprint covers both). The constructor checks the declared groups are structurally sound
    (same input, widths, message and aggregator kind)."""

    row_wise = True  # slices and concatenates; layers.rowwise checks each member conv itself

    def __init__(self, in_dim: int, members: list, share: dict):
        super().__init__()
        self.in_dim = int(in_dim)
        self.inputs: list[tuple[int, int]] = []
        self._conv_of: list[int | None] = []
        convs: list[MergeableConv] = []
        for number, member in enumerate(members):
            start, stop = (int(v) for v in member["input"])
            if not 0 <= start < stop <= self.in_dim:
                raise ValueError(f"bundle member {number}: input [{start}, {stop}) is not inside [0, {self.in_dim})")
            self.inputs.append((start, stop))
            if member.get("conv") is None:
                self._conv_of.append(None)
                continue
            conv = build_conv(member["conv"])
            if conv.in_dim != stop - start:
                raise ValueError(
                    f"bundle member {number} ({conv.kind}) reads {conv.in_dim} columns, given {stop - start}"
                )
            self._conv_of.append(len(convs))
            convs.append(conv)
        if not convs:
            raise ValueError("a bundle needs at least one member convolution")
        self.convs = torch.nn.ModuleList(convs)
        self._out_dims = [self._member_out(i) for i in range(len(self.inputs))]
        self.out_dim = sum(self._out_dims)
        self._set_edge_contract()
        self._dst = self._dst_columns()
        self.share = {mode: self._checked_ids(share, mode) for mode in MODES}
        self._layouts = {pre: self._layout(pre) for pre in (False, True)}
        self.can_pre_transform = any(conv.can_pre_transform for conv in self.real())
        self.aggregator = self._aggregator()

    # -- structure ---------------------------------------------------------------------------
    def member(self, i: int) -> MergeableConv | None:
        """Member i's conv, None for a pass-through member."""
        j = self._conv_of[i]
        return None if j is None else cast(MergeableConv, self.convs[j])

    def _conv(self, i: int) -> MergeableConv:
        """Member i's conv, for members that have one (group representatives)."""
        conv = self.member(i)
        assert conv is not None, f"bundle member {i} passes its rows through"
        return conv

    def real(self) -> list[MergeableConv]:
        return [cast(MergeableConv, conv) for conv in self.convs]

    def _member_out(self, i: int) -> int:
        conv = self.member(i)
        start, stop = self.inputs[i]
        return stop - start if conv is None else conv.out_dim

    def config(self):
        return {
            "kind": self.kind,
            "in_dim": self.in_dim,
            "share": self.share,
            "members": [
                {"input": [start, stop], "conv": None if conv is None else conv.config()}
                for (start, stop), conv in zip(self.inputs, map(self.member, range(len(self.inputs))), strict=True)
            ],
        }

    def _set_edge_contract(self) -> None:
        """One edge list for all members: one self-loop policy, one answer to 'do edge weights
        count' for every statistic (module doc)."""
        policies = sorted({conv.self_loops for conv in self.real()})
        if len(policies) > 1:
            raise ValueError(
                f"bundle members apply different self-loop policies {policies}: they cannot share one edge list"
            )
        self.self_loops = policies[0]
        self.uses_edge_weight = any(conv.uses_edge_weight for conv in self.real())
        mixed = [c.kind for c in self.real() if c.required_stats and c.uses_edge_weight != self.uses_edge_weight]
        if mixed:
            raise ValueError(
                f"bundle members disagree on whether edge weights count in their node statistics ({mixed} vs the rest)"
            )
        self.required_stats = tuple(dict.fromkeys(s for conv in self.real() for s in conv.required_stats))
        self.needs_dst_in_message = any(conv.needs_dst_in_message for conv in self.real())

    def _dst_columns(self) -> dict[int, tuple[int, int]]:
        """Destination payload columns of each member that has one."""
        out, start = {}, 0
        for i in range(len(self.inputs)):
            conv = self.member(i)
            if conv is not None and conv.dst_width():
                out[i] = (start, start + conv.dst_width())
                start += conv.dst_width()
        return out

    def _checked_ids(self, share: dict, mode: str) -> list:
        ids = list(share.get(mode) or [])
        if len(ids) != len(self.inputs):
            raise ValueError(f"bundle share[{mode!r}] has {len(ids)} entries for {len(self.inputs)} members")
        for i, entry in enumerate(ids):
            if (entry is None) != (self.member(i) is None):
                raise ValueError(f"bundle share[{mode!r}][{i}]: a pass-through member has no groups, others two")
        return [None if e is None else [int(e[0]), int(e[1])] for e in ids]

    def _layout(self, pre: bool) -> _Layout:
        """The declared groups of one mode as column ranges, checked: a group's members read the
        same input and ship payloads / messages of the same width, reduced by the same aggregator."""
        layout = _Layout()
        mode = MODES[int(bool(pre))]
        for i, ids in enumerate(self.share[mode]):
            conv = self.member(i)
            if conv is None or ids is None:
                layout.member_agg.append(None)
                continue
            p, a = ids
            if p == len(layout.payloads):
                at = layout.payloads[-1].stop if layout.payloads else 0
                layout.payloads.append(_Group(i, at, at + conv.src_width(pre)))
            if p >= len(layout.payloads):
                raise ValueError(f"bundle share[{mode!r}]: payload group {p} used before group {len(layout.payloads)}")
            rep = layout.payloads[p]
            if self.inputs[rep.rep] != self.inputs[i] or rep.stop - rep.start != conv.src_width(pre):
                raise ValueError(f"bundle share[{mode!r}]: members {rep.rep} and {i} cannot share a payload")
            if a == len(layout.aggs):
                at = layout.aggs[-1].stop if layout.aggs else 0
                out = layout.aggs[-1].out[1] if layout.aggs else 0
                width = conv.msg_width(pre)
                out_width = conv.aggregator.out_width(width)
                layout.aggs.append(_Group(i, at, at + width, (out, out + out_width), p, conv.aggregator))
            if a >= len(layout.aggs):
                raise ValueError(f"bundle share[{mode!r}]: aggregation group {a} used before group {len(layout.aggs)}")
            group = layout.aggs[a]
            lead = self._conv(group.rep)
            if (
                group.payload != p
                or group.stop - group.start != conv.msg_width(pre)
                or _agg_key(lead.aggregator) != _agg_key(conv.aggregator)
                or lead.kind != conv.kind
            ):
                raise ValueError(f"bundle share[{mode!r}]: members {group.rep} and {i} cannot share an aggregation")
            layout.member_agg.append(a)
        layout.parts = _fused_parts(layout.aggs)
        layout.scaled = self._scaled(layout, pre)
        return layout

    @classmethod
    def from_convs(cls, in_dim: int, members: list[tuple[tuple[int, int], MergeableConv | None]]) -> BundleConv:
        """The bundle of these convs (copied, weights included), sharing what their current
        weights allow (share_ids)."""
        share = {mode: share_ids(members, pre) for mode, pre in zip(MODES, (False, True), strict=True)}
        configs = [{"input": list(span), "conv": None if conv is None else conv.config()} for span, conv in members]
        bundle = cls(in_dim, configs, share)
        for target, conv in zip(bundle.real(), [c for _, c in members if c is not None], strict=True):
            target.load_state_dict(conv.state_dict())
        return bundle

    def _scaled(self, layout: _Layout, pre: bool) -> bool:
        """Whether the composite message is (scale x composite payload): every group's message is
        its payload scaled (one group per payload, in payload order) by one common scale, which
        is the edge weight for every group when the bundle passes weights, else 1."""
        one_to_one = len(layout.aggs) == len(layout.payloads) and all(
            g.payload == n and g.stop - g.start == layout.payloads[n].stop - layout.payloads[n].start
            for n, g in enumerate(layout.aggs)
        )
        if not one_to_one:
            return False
        reps = [self._conv(g.rep) for g in layout.aggs]
        if not all(conv.message_scale(None, pre)[0] for conv in reps):
            return False
        if not self.uses_edge_weight:
            return True
        scales = [conv.message_scale(_PROBE_WEIGHT if conv.uses_edge_weight else None, pre)[1] for conv in reps]
        return all(s is not None and torch.equal(s, scales[0]) for s in scales)

    def _aggregator(self) -> Aggregator:
        """One aggregator for both modes: a plain one when each mode is one part of the same
        aggregator (widths do not matter to it), else a ConcatAggregator picking the mode by
        width; a bundle whose modes' widths collide runs raw only."""
        raw, pre = self._layouts[False].parts, self._layouts[True].parts
        layouts = [raw] if raw == pre or not self.can_pre_transform else [raw, pre]
        singles = {(p[0]["name"], _options(p[0])) for p in layouts if len(p) == 1}
        if all(len(p) == 1 for p in layouts) and len(singles) == 1:
            return get_aggregator(raw[0]["name"], **raw[0]["options"])
        try:
            return ConcatAggregator(layouts)
        except ValueError:
            self.can_pre_transform = False
            self._layouts[True] = self._layouts[False]
            return ConcatAggregator([raw])

    def layout(self, pre: bool) -> _Layout:
        return self._layouts[self._pre(pre)]

    # -- widths --------------------------------------------------------------------------------
    def src_width(self, pre_transform):
        return self.layout(pre_transform).src_width

    def msg_width(self, pre_transform):
        return self.layout(pre_transform).msg_width

    def dst_width(self):
        return max((stop for _start, stop in self._dst.values()), default=0)

    def plan_info(self) -> dict:
        # message_scaled must hold in the mode the planner picks, so it is asked of both
        info = super().plan_info()
        info["message_scaled"] = all(self.message_scale(None, pre)[0] for pre in (False, True))
        return info

    # -- the contract --------------------------------------------------------------------------
    def prepare_src(self, h, stats, pre_transform):
        layout = self.layout(pre_transform)
        outs = [
            self._conv(g.rep).prepare_src(columns(h, *self.inputs[g.rep]), stats, pre_transform)
            for g in layout.payloads
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def prepare_dst(self, h, stats):
        if not self._dst:
            return None
        outs: list[Tensor] = []
        for i in self._dst:  # the members with a destination width: each prepares a payload
            out = self._conv(i).prepare_dst(columns(h, *self.inputs[i]), stats)
            assert out is not None, f"member {i} has a destination width but prepared no payload"
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def message(self, src_e, dst_e, weight_e, pre_transform):
        layout = self.layout(pre_transform)
        outs = []
        for group in layout.aggs:
            conv = self._conv(group.rep)
            payload = layout.payloads[group.payload]
            dst = columns(dst_e, *self._dst[group.rep]) if group.rep in self._dst else None
            weight = weight_e if conv.uses_edge_weight else None
            outs.append(conv.message(columns(src_e, payload.start, payload.stop), dst, weight, pre_transform))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def message_scale(self, weight_e, pre_transform):
        layout = self.layout(pre_transform)
        if not layout.scaled:
            return False, None
        conv = self._conv(layout.aggs[0].rep)
        return True, conv.message_scale(weight_e if conv.uses_edge_weight else None, pre_transform)[1]

    def update(self, h_dst, agg, stats, pre_transform):
        layout = self.layout(pre_transform)
        outs = []
        for i, group_at in enumerate(layout.member_agg):
            rows = columns(h_dst, *self.inputs[i])
            if group_at is None:
                outs.append(rows)
                continue
            group = layout.aggs[group_at]
            outs.append(self._conv(i).update(rows, columns(agg, *group.out), stats, pre_transform))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
