"""Skip connections between rounds: the node ops that save and combine earlier values, and the
wrappers that carry saved values through the rounds between their save and their last read.

A model whose node-wise ops read values of earlier rounds (a residual add `conv2(x) + x`, a
concatenation of round outputs, JumpingKnowledge 'cat' / 'max') is written in the spec as a chain
with two more node ops:

    {"op": "save", "slot": "s0"}                        keep the current value as slot s0
    {"op": "combine", "mode": "add" | "cat" | "max",    the current value becomes the sum, the
     "inputs": ["s0", "h", ...], "widths": [16, 16]}    concatenation or the element-wise max of
                                                        the inputs ("h": the current value)

WHY carried columns, not a second table: every executor, strategy, the planner and the pruned
path move one row per vertex between rounds and call the round's conv on it. A saved value
therefore rides along in that row, after the value the next conv reads: the row is
[main | carried slots], a round's conv (CarryRound) reads and ships only `main` (its payloads
and messages are those of the wrapped conv) and passes the carried columns through its update,
and a stack of node ops (CarryStack) applies the plain ops to `main` and the save / combine ops
to the slots. A slot is carried from its save to its last read and no further, so a row holds
exactly the columns a later op needs, and the planner, which prices rows by the rounds' widths,
counts their bytes. A model without save / combine ops is built exactly as before (no wrapper).

WHY the PE store, its refresh and serving need nothing of their own: a saved value is
node-local (a vertex's skip inputs are its own earlier values), so the row after round l,
[main | carried], is everything round l+1 and the ops after it read of that vertex. The store
keeps that row as layer l's h (its width is the next round's in_dim; the last round carries
nothing, so the output layer is the model's output), and a vertex recomputed from its stored
row and state by a refresh or a reuse serving mode gets its carried columns back exactly as a
chain model gets its h. A chain model's rows, and so its stores, are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
from torch import Tensor

from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.nodeops import NodeOp, NodeOpStack, _op, columns

CURRENT = "h"
COMBINE_MODES = ("add", "cat", "max")


@_op("save")
class SaveOp(NodeOp):
    """Keep the current value as `slot` for a later combine (module doc). Alone (outside a
    CarryStack) it is the identity: the saving happens in the stack that holds it."""

    row_wise = True

    def __init__(self, slot: str):
        super().__init__()
        if not isinstance(slot, str) or not slot or slot == CURRENT:
            raise ValueError(f"save: slot must be a non-empty name other than {CURRENT!r}, got {slot!r}")
        self.slot = slot

    def config(self):
        return {"op": self.op, "slot": self.slot}

    def forward(self, x):
        return x


@_op("combine")
class CombineOp(NodeOp):
    """The current value becomes add / cat / max of `inputs` (slot names, CURRENT for the current
    value), whose widths are `widths`. add is binary (a + b, as a forward writes it: float
    addition is commutative, so the order of the two is immaterial); cat concatenates along the
    features in the order given (torch.cat(xs, dim=-1)); max is the element-wise maximum
    (JumpingKnowledge 'max': torch.stack(xs, -1).max(-1))."""

    row_wise = True

    def __init__(self, mode: str, inputs: list, widths: list | None):
        """`widths` None: not known yet (a converter fills them in with `set_widths` once the
        layers are sized); a spec always gives them."""
        super().__init__()
        if mode not in COMBINE_MODES:
            raise ValueError(f"combine: mode must be one of {COMBINE_MODES}, got {mode!r}")
        self.mode = mode
        self.inputs = [str(i) for i in inputs]
        if len(self.inputs) < 2 or self.inputs.count(CURRENT) != 1:
            raise ValueError(f"combine: needs two or more inputs, the current value {CURRENT!r} exactly once")
        if mode == "add" and len(self.inputs) != 2:
            raise ValueError("combine: add takes exactly two inputs")
        self.widths: list[int] = []
        if widths is not None:
            self.set_widths(widths)

    def set_widths(self, widths: list) -> None:
        widths = [int(w) for w in widths]
        if len(widths) != len(self.inputs) or min(widths) < 1:
            raise ValueError(f"combine: needs one positive width per input, got {widths}")
        if self.mode in ("add", "max") and len(set(widths)) != 1:
            raise ValueError(f"combine: {self.mode} needs inputs of one width, got {widths}")
        self.widths = widths

    def config(self):
        return {"op": self.op, "mode": self.mode, "inputs": list(self.inputs), "widths": list(self.widths)}

    def out_dim(self, in_dim):
        if not self.widths:
            raise ValueError("combine: the widths of its inputs are not known yet")
        own = self.widths[self.inputs.index(CURRENT)]
        if in_dim != own:
            raise ValueError(f"combine expects the current value {own} wide, got {in_dim}")
        return sum(self.widths) if self.mode == "cat" else own

    def forward(self, x):
        raise RuntimeError("a combine op reads saved slots: it runs inside a CarryStack (Model builds one)")

    def combine(self, values: list[Tensor]) -> Tensor:
        if self.mode == "add":
            return values[0] + values[1]
        if self.mode == "cat":
            return torch.cat(values, dim=-1)
        return torch.stack(values, dim=-1).max(dim=-1)[0]


def is_dag_op(op: torch.nn.Module) -> bool:
    return isinstance(op, (SaveOp, CombineOp))


@dataclass
class Layout:
    """A row's columns at one point of the model: `main` (the value the next op reads) first,
    then each carried slot, in the order they were saved."""

    main: int
    carried: list[tuple[str, int]] = field(default_factory=list)

    @property
    def width(self) -> int:
        return self.main + sum(w for _, w in self.carried)

    def copy(self) -> Layout:
        return Layout(self.main, list(self.carried))


class CarryStack(NodeOpStack):
    """A node-op stack over rows [main | carried]: plain ops read and write `main`, save appends
    `main` as a slot, combine replaces `main`; each slot is dropped right after its last read
    (`drops[i]`: slots dropped after op i). Row-wise: every op reads one row (its checked ops
    are checked one by one as submodules)."""

    row_wise = True

    def __init__(self, ops: list[NodeOp], layout_in: Layout, drops: list[list[str]]):
        super().__init__(ops=list(ops))
        self.layout_in = layout_in.copy()
        self.drops = [list(d) for d in drops]
        self.layout_out = self._walk_layout()

    def _walk_layout(self) -> Layout:
        layout = self.layout_in.copy()
        for op, drop in zip(self.ops, self.drops, strict=True):
            if isinstance(op, SaveOp):
                if op.slot in dict(layout.carried):
                    raise ValueError(f"slot {op.slot!r} is saved while still carried")
                layout.carried.append((op.slot, layout.main))
            elif isinstance(op, CombineOp):
                known = dict(layout.carried, **{CURRENT: layout.main})
                for name, width in zip(op.inputs, op.widths, strict=True):
                    if name not in known:
                        raise ValueError(f"combine reads slot {name!r}, which is not carried here")
                    if known[name] != width:
                        raise ValueError(f"combine: slot {name!r} is {known[name]} wide, the op says {width}")
                layout.main = op.out_dim(layout.main)
            else:
                layout.main = cast(NodeOp, op).out_dim(layout.main)
            layout.carried = [(s, w) for s, w in layout.carried if s not in drop]
        return layout

    def out_dim(self, in_dim: int) -> int:
        if in_dim != self.layout_in.width:
            raise ValueError(f"node ops with carried slots expect width {self.layout_in.width}, got {in_dim}")
        return self.layout_out.width

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        if start:
            raise ValueError("a stack with carried slots runs whole (start=0)")
        main = columns(x, 0, self.layout_in.main)
        slots: dict[str, Tensor] = {}
        col = self.layout_in.main
        for name, width in self.layout_in.carried:
            slots[name] = columns(x, col, col + width)
            col += width
        for op, drop in zip(self.ops, self.drops, strict=True):
            if isinstance(op, SaveOp):
                slots[op.slot] = main
            elif isinstance(op, CombineOp):
                main = op.combine([main if name == CURRENT else slots[name] for name in op.inputs])
            else:
                main = op(main)
            for name in drop:
                del slots[name]
        return torch.cat([main, *slots.values()], dim=1) if slots else main


class CarryRound(MergeableConv):
    """A round whose row carries `carry` columns after the conv's input (module doc): payloads,
    messages and states are the wrapped conv's, computed from the leading `conv.in_dim` columns;
    the update appends the carried columns unchanged after the conv's output."""

    row_wise = True  # the update slices and concatenates one row; the conv is checked as a submodule

    def __init__(self, conv: MergeableConv, carry: int):
        super().__init__()
        if carry < 1:
            raise ValueError("a carry round carries at least one column")
        self.conv, self.carry = conv, int(carry)
        # a whole-neighbourhood conv (the generic fallback) stays one: `neighbourhoods` and
        # `by_destinations` run it on the leading columns and append the carried ones
        self.edge_mergeable = bool(getattr(conv, "edge_mergeable", True))
        self.kind = f"{conv.kind}+carry"
        self.aggregator = conv.aggregator
        self.in_dim = conv.in_dim + self.carry
        self.out_dim = conv.out_dim + self.carry
        self.self_loops = conv.self_loops
        self.uses_edge_weight = conv.uses_edge_weight
        self.edge_attr_dim = getattr(conv, "edge_attr_dim", 0)
        self.required_stats = tuple(conv.required_stats)
        self.needs_dst_in_message = conv.needs_dst_in_message
        self.can_pre_transform = conv.can_pre_transform

    def config(self) -> dict:
        """Descriptive only: carry rounds are never in a spec (Model rebuilds them)."""
        return {"kind": "carry_round", "carry": self.carry, "conv": self.conv.config()}

    def _main(self, h: Tensor) -> Tensor:
        return columns(h, 0, self.conv.in_dim)

    def src_width(self, pre_transform):
        return self.conv.src_width(pre_transform)

    def dst_width(self):
        return self.conv.dst_width()

    def msg_width(self, pre_transform):
        return self.conv.msg_width(pre_transform)

    def state_width(self, pre_transform):
        return self.conv.state_width(pre_transform)

    def prepare_src(self, h, stats, pre_transform):
        return self.conv.prepare_src(self._main(h), stats, pre_transform)

    def prepare_dst(self, h, stats):
        return self.conv.prepare_dst(self._main(h), stats)

    def message(self, src_e, dst_e, weight_e, pre_transform):
        return self.conv.message(src_e, dst_e, weight_e, pre_transform)

    def message_scale(self, weight_e, pre_transform):
        return self.conv.message_scale(weight_e, pre_transform)

    def update(self, h_dst, agg, stats, pre_transform):
        out = self.conv.update(self._main(h_dst), agg, stats, pre_transform)
        return self._with_carry(out, h_dst)

    def _with_carry(self, out: Tensor, h_dst: Tensor) -> Tensor:
        return torch.cat([out, h_dst[:, self.conv.in_dim :].to(out.dtype)], dim=1)

    def plan_info(self) -> dict:
        info = super().plan_info()
        if not self.edge_mergeable:
            info["whole_neighbourhoods"] = True
        return info

    def neighbourhoods(self, x: Tensor, src: Tensor, dst: Tensor, num_dst: int, h_own: Tensor | None = None) -> Tensor:
        """A whole-neighbourhood conv's output at the first `num_dst` rows of `x` (the prepared
        source rows: own vertices, then mirrored sources; only the conv's columns travel), followed
        by the carried columns of the own vertices' full rows `h_own` (the DL step's own h)."""
        if self.edge_mergeable or h_own is None:
            raise ValueError(f"{self.kind}: neighbourhoods needs a whole-neighbourhood conv and the own rows")
        out = getattr(self.conv, "neighbourhoods")(x, src, dst, num_dst)  # noqa: B009 - only such convs define it
        return self._with_carry(out, h_own[:num_dst])

    def by_destinations(self, h: Tensor, src: Tensor, dst: Tensor, *, parts: int, seed: int) -> Tensor:
        """Reference execution of a whole-neighbourhood conv (propagate): the conv's own
        partitioned run on the leading columns, the carried columns appended per vertex."""
        by_destinations = getattr(self.conv, "by_destinations")  # noqa: B009 - only such convs define it
        return self._with_carry(by_destinations(self._main(h), src, dst, parts=parts, seed=seed), h)


def has_dag_ops(stacks: list[NodeOpStack]) -> bool:
    return any(is_dag_op(op) for stack in stacks for op in stack.ops)


def size_combines(in_dim: int, pre: list, convs: list[MergeableConv], posts: list[list]) -> None:
    """Fill in each CombineOp's input widths (a converter builds them before the layers are
    sized): the width of each saved slot and of the current value where the op runs. ValueError
    when the widths do not fit (a conv reading another width, an add of two widths)."""
    saved: dict[str, int] = {}

    def walk(ops: list, width: int) -> int:
        for op in ops:
            if isinstance(op, SaveOp):
                saved[op.slot] = width
            elif isinstance(op, CombineOp):
                op.set_widths([width if name == CURRENT else saved[name] for name in op.inputs])
            width = op.out_dim(width)
        return width

    width = walk(pre, in_dim)
    for conv, post in zip(convs, posts, strict=True):
        if conv.in_dim != width:
            raise ValueError(f"conv {conv.kind} expects width {conv.in_dim}, gets {width}")
        width = walk(post, conv.out_dim)


def carry_rounds(
    in_dim: int, pre: NodeOpStack, rounds: list[MergeableConv], posts: list[NodeOpStack]
) -> tuple[CarryStack, list[MergeableConv], list[NodeOpStack]]:
    """The model's pre stack, rounds and post stacks over rows that carry each saved slot from
    its save to its last read (module doc). ValueError for a slot read before it is saved, saved
    twice while carried, never read, or still carried at the end."""
    stacks = [pre, *posts]
    last_read: dict[str, tuple[int, int]] = {}
    saved: set[str] = set()
    for s, stack in enumerate(stacks):
        for i, op in enumerate(stack.ops):
            if isinstance(op, SaveOp):
                saved.add(op.slot)
            elif isinstance(op, CombineOp):
                for name in op.inputs:
                    if name != CURRENT:
                        last_read[name] = (s, i)
    unread = sorted(saved - set(last_read))
    if unread:
        raise ValueError(f"slots {unread} are saved but never read")
    unsaved = sorted(set(last_read) - saved)
    if unsaved:
        raise ValueError(f"slots {unsaved} are read but never saved")

    def wrap(s: int, stack: NodeOpStack, layout: Layout) -> CarryStack:
        drops = [[n for n, at in last_read.items() if at == (s, i)] for i in range(len(stack.ops))]
        return CarryStack([cast(NodeOp, op) for op in stack.ops], layout, drops)

    new_pre = wrap(0, pre, Layout(in_dim))
    layout = new_pre.layout_out
    new_rounds: list[MergeableConv] = []
    new_posts: list[NodeOpStack] = []
    for r, (conv, post) in enumerate(zip(rounds, posts, strict=True)):
        if layout.main != conv.in_dim:
            raise ValueError(f"round {r} ({conv.kind}) expects width {conv.in_dim}, gets {layout.main}")
        carry = layout.width - layout.main
        new_rounds.append(CarryRound(conv, carry) if carry else conv)
        layout = Layout(conv.out_dim, list(layout.carried))
        stack = wrap(r + 1, post, layout)
        new_posts.append(stack)
        layout = stack.layout_out
    if layout.carried:
        raise ValueError(f"slots {[s for s, _ in layout.carried]} are still carried after the last round")
    return new_pre, new_rounds, new_posts
