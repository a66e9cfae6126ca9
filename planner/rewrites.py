"""Plan rewrites: transform-then-propagate, and fusion of adjacent DL operators.

Transform-then-propagate (docs/ARCHITECTURE.md, "Data movement and the planner": apply a linear
message transform before moving data when it shrinks F): if the layer's message is linear in h_src
(GCN, SAGE-sum/mean, GAT's W·h), the transform can run once per vertex at its owner, so every
edge/mirror/partial row carries the smaller width. It is applied exactly when allowed and it shrinks
the source payload; it changes the widths every strategy's bytes are computed with.

Fusion (Lotan's operator pushdown/reordering spirit, §4.2): each strategy writes its DL work as
separate Python round trips; fusion merges round trips that follow each other with no Spark
operator between them into ONE Pipe round trip per partition. Across layers it also hoists the
next layer's owner-side preparation (prepare_src, and for combine the partial aggregation) into
this layer's pass: the update already runs at the vertex's owner partition, where the next layer
needs h, so preparing there costs no extra round trip. Each pass costs a fixed overhead
(CostModel.pass_overhead_s) and re-ships its inputs, so this is the single largest saving for deep
models.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkgnn.planner.inputs import LayerSpec
from sparkgnn.planner.ir import Operator
from sparkgnn.planner.segments import refresh_pipe


@dataclass(frozen=True)
class LayerWidths:
    """Floats per row each boundary carries, after the transform-ordering decision.

    `input` is what Spark holds before the layer (x for layer 0, else h = in_dim) and `output`
    what the update hands back (the next conv's in_dim: node-wise ops between convs, e.g. a
    Linear head, run fused after the update and may change the width; the last layer's out_dim
    otherwise)."""

    in_dim: int
    out_dim: int
    src: int
    msg: int
    state: int
    dst: int
    input: int
    output: int


def choose_pre_transform(spec: LayerSpec) -> tuple[bool, str]:
    """Whether to transform before propagating, and why (for the plan's rewrite log)."""
    raw, pre = spec.src_width.raw, spec.src_width.pre_transform
    if not spec.can_pre_transform:
        return False, f"transform-then-propagate not allowed for {spec.kind}: message is not a per-vertex linear map"
    if pre < raw:
        return True, f"transform-then-propagate: source payload {raw} -> {pre} floats per row"
    return False, f"transform-then-propagate skipped: it would not shrink the payload ({raw} -> {pre} floats)"


def widths(
    spec: LayerSpec, pre_transform: bool, input_width: int | None = None, output_width: int | None = None
) -> LayerWidths:
    return LayerWidths(
        in_dim=spec.in_dim,
        out_dim=spec.out_dim,
        src=spec.src_width.pick(pre_transform),
        msg=spec.msg_width.pick(pre_transform),
        state=spec.state_width.pick(pre_transform),
        dst=spec.dst_width,
        input=spec.in_dim if input_width is None else input_width,
        output=spec.out_dim if output_width is None else output_width,
    )


def _is_pipe(op: Operator, direction: str) -> bool:
    return op.name == "Pipe" and op.direction == direction


def _union(into: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Merge named byte counts. The same name is the same data (e.g. the own rows both the
    aggregation and the update read), so it is shipped once: take the max, never the sum."""
    merged = dict(into)
    for key, value in more.items():
        merged[key] = max(merged.get(key, 0), value)
    return merged


def fuse(ops: list[Operator]) -> list[Operator]:
    """Merge every 'DL op, Pipe back, Pipe in, DL op' into 'DL op, DL op'.

    The dropped Pipe back's intermediate bytes and the dropped Pipe in's carried bytes vanish
    (they stay in the worker); the Pipe in's side inputs move to the pass's opening Pipe; the
    Pipe back's kept outputs move to the pass's closing Pipe. Returns new Pipe operators; the
    input list is not modified.
    """
    out: list[Operator] = []
    opener_at: int | None = None
    pending_kept: dict[str, int] = {}
    for op in ops:
        if (
            _is_pipe(op, "to_dl")
            and len(out) >= 2
            and _is_pipe(out[-1], "to_graph")
            and out[-2].engine == "DL"
            and opener_at is not None
        ):
            closing = out.pop()
            pending_kept = _union(pending_kept, closing.attrs["kept"])
            opener = out[opener_at]
            out[opener_at] = refresh_pipe(
                replace(opener, attrs={**opener.attrs, "side": _union(opener.attrs["side"], op.attrs["side"])})
            )
            continue
        if _is_pipe(op, "to_dl"):
            opener_at = len(out)
        if _is_pipe(op, "to_graph") and pending_kept:
            # The closing Pipe of a fused pass belongs to the layer that opened the pass.
            assert opener_at is not None  # pending_kept is only filled by a merge, which needs an opener
            op = refresh_pipe(
                replace(
                    op, layer=out[opener_at].layer, attrs={**op.attrs, "kept": _union(op.attrs["kept"], pending_kept)}
                )
            )
            pending_kept = {}
        out.append(op)
    return out


def hoist(host: list[Operator], prefix: list[Operator]) -> list[Operator]:
    """Place the next layer's owner-side preparation right after the host layer's last Pipe
    back (before its Materialize), so `fuse` folds it into the host's last pass."""
    if not prefix:
        return list(host)
    last_back = max(i for i, op in enumerate(host) if _is_pipe(op, "to_graph"))
    return host[: last_back + 1] + list(prefix) + host[last_back + 1 :]


def fill_materialize(ops: list[Operator]) -> list[Operator]:
    """A Materialize stores what the pass before it kept (h of the next layer, plus whatever
    hoisted preparation produced); set its bytes and detail from that Pipe."""
    out = []
    last_kept: dict[str, int] = {}
    for op in ops:
        if _is_pipe(op, "to_graph"):
            last_kept = op.attrs["kept"]
        if op.name == "Materialize" and last_kept:
            what = ", ".join(last_kept)
            op = replace(op, est_bytes=sum(last_kept.values()), detail=f"{op.detail} [{what}]")
        out.append(op)
    return out
