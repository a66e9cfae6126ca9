"""Building blocks strategies use to write their operator chains: row sizes and DL segments.

Why: every strategy writes its DL work *unfused* — each DL operator in its own Pipe round trip,
declaring what it needs from the previous DL operator (`carried`), what Spark must ship besides
(`side`), what only the next DL op needs (`intermediate`) and what Spark must keep (`kept`).
The fusion rewrite can then merge adjacent round trips mechanically and correctly (carried and
intermediate bytes vanish, side and kept bytes survive) without knowing any strategy.
"""

from __future__ import annotations

from collections.abc import Iterable

from sparkgnn.planner.ir import Operator

FLOAT_BYTES = 4
#: Per shuffled row: the partition key + vertex id (the brief's "+16"); also an edge's (src, dst).
ROW_BYTES = 16
#: Per vertex row inside an Arrow batch going to Python: the vertex id.
ID_BYTES = 8
#: An edge weight, when the layer uses one.
WEIGHT_BYTES = 4


def shuffled(rows: int, width: int) -> int:
    """Bytes of `rows` shuffled rows carrying `width` floats each."""
    return rows * (width * FLOAT_BYTES + ROW_BYTES)


def to_python(rows: int, width: int) -> int:
    """Bytes of `rows` vertex rows with `width` floats in an Arrow batch."""
    return rows * (width * FLOAT_BYTES + ID_BYTES)


def edge_row_bytes(uses_edge_weight: bool) -> int:
    return ROW_BYTES + (WEIGHT_BYTES if uses_edge_weight else 0)


def graph(name: str, est_bytes: int, detail: str, rows: int = 0, layer: int | None = None, **attrs) -> Operator:
    return Operator(name, "GRAPH", int(est_bytes), detail, est_rows=int(rows), layer=layer, attrs=dict(attrs))


def dl(name: str, detail: str, rows: int = 0, edges: int = 0, layer: int | None = None, **attrs) -> Operator:
    if edges:
        attrs["edges"] = int(edges)
    return Operator(name, "DL", 0, detail, est_rows=int(rows), layer=layer, attrs=dict(attrs))


def pipe_to_dl(carried: int, side: dict[str, int], layer: int | None, carried_as: str = "") -> Operator:
    side = {k: int(v) for k, v in side.items()}
    total = int(carried) + sum(side.values())
    names = ([carried_as or "previous result"] if carried else []) + list(side)
    parts = ", ".join(names) or "nothing"
    return Operator(
        "Pipe",
        "PIPE",
        total,
        f"GRAPH -> DL (Arrow batches): {parts}",
        layer=layer,
        attrs={"direction": "to_dl", "carried": int(carried), "carried_as": carried_as, "side": side},
    )


def pipe_to_graph(intermediate: int, kept: dict[str, int], layer: int | None) -> Operator:
    kept = {k: int(v) for k, v in kept.items()}
    total = int(intermediate) + sum(kept.values())
    parts = ", ".join(kept) or "intermediate result"
    return Operator(
        "Pipe",
        "PIPE",
        total,
        f"DL -> GRAPH: {parts}",
        layer=layer,
        attrs={"direction": "to_graph", "intermediate": int(intermediate), "kept": kept},
    )


def segment(
    ops: Iterable[Operator],
    *,
    layer: int | None,
    carried: int = 0,
    carried_as: str = "",
    side: dict[str, int] | None = None,
    intermediate: int = 0,
    kept: dict[str, int] | None = None,
) -> list[Operator]:
    """One Python round trip: Pipe in, the DL operators, Pipe back. `carried` is the input the
    previous step produced (named `carried_as`); it vanishes when fusion joins the two steps."""
    return [pipe_to_dl(carried, side or {}, layer, carried_as), *ops, pipe_to_graph(intermediate, kept or {}, layer)]


def refresh_pipe(op: Operator) -> Operator:
    """Recompute a Pipe's bytes and detail from its attrs (after the fusion rewrite edited them)."""
    if op.direction == "to_dl":
        fresh = pipe_to_dl(op.attrs["carried"], op.attrs["side"], op.layer, op.attrs.get("carried_as", ""))
    else:
        fresh = pipe_to_graph(op.attrs["intermediate"], op.attrs["kept"], op.layer)
    fresh.id, fresh.children = op.id, op.children
    return fresh
