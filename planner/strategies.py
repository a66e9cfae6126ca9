"""The physical data-movement strategies of one layer, as a registry, with edge_join and replicate
(combine lives in planner/combine.py and pushdown in planner/pushdown.py; both register
themselves the same way, and this module holds what all of them share).

Each strategy says (1) whether it can run a layer (`blocker`: the reason it cannot, or None),
(2) the operator chain the executor runs (`program`), written unfused so the fusion rewrite can
merge round trips, and (3) which static edge partitioning it needs (`edges_by`). Costs are never
written here: they are measured from the operators (cost.measure), so a strategy's cost and its
plan cannot drift apart. Adding a strategy = writing these three things and calling register().

What the executor does, and the bytes each moves (F = floats per row, +16 = key + id):
  edge_join  edges cached by src; join h on src (local), shuffle edge rows to part(dst); DL
             aggregates + updates at dst.         |E|(F_src*4+16) + |V|(in_dim*4+16)
  replicate  edges cached by dst; each owner ships its src payload once to every OTHER partition
             holding an out-edge (mirror_rows, Lotan eq. 4: R_f = 1 + mirror_rows/|V|) and its
             own row home.                        mirror_rows(F_src*4+16) + |V|(in_dim*4+16)
  combine    edges cached by src; partial states per (src partition, dst) are computed where the
             sources live, only cross-partition partials move, merged at dst.
                                                  combine_rows(F_state*4+16) + |V|(in_dim*4+16)
             + if the message needs the dst (GAT): dst payloads to in-mirrors first
                                                  in_mirror_rows(F_dst*4+16), one more pass.
  pushdown   edges cached in Spark by src; payloads join them there, a native aggregate forms the
             partial states (JVM), they merge by dst, one state per dst goes to its owner.
                                                  |V|(F_src*4+16) + partial x buffer_row_bytes
                                                  + |V|(F_state*4+16) + |V|(in_dim*4+16)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sparkgnn.planner.errors import PlanError
from sparkgnn.planner.inputs import GraphStats, LayerSpec
from sparkgnn.planner.ir import Operator
from sparkgnn.planner.rewrites import LayerWidths
from sparkgnn.planner.segments import (
    FLOAT_BYTES,
    ROW_BYTES,
    dl,
    edge_row_bytes,
    graph,
    segment,
    shuffled,
    to_python,
)

#: required_stats names that depend on the neighbourhood's data (normalized moments need the
#: neighbourhood mean before the central moments can be summed). Partial states at the source
#: partitions cannot be formed without them, so `combine` does not apply; every other name is
#: a static per-vertex graph statistic (degrees) computed once by the graph engine.
DATA_DEPENDENT_STATS = frozenset({"mean", "neighbor_mean", "neighbourhood_mean", "moments_mean"})


@dataclass(frozen=True)
class Rows:
    """Row counts one layer works on (scaled down for the last layer when ids are requested)."""

    vertices: int
    edges: int
    mirror: int | None
    combine: int | None
    in_mirror: int | None
    local_combine: int
    sources: int
    fraction: float = 1.0

    @classmethod
    def of(cls, stats: GraphStats, fraction: float = 1.0) -> Rows:
        def scale(value: int) -> int:
            return int(math.ceil(value * fraction))

        def scale_measured(value: int | None) -> int | None:
            return None if value is None else scale(value)

        # Partial states that stay inside their partition: unknown unless Spark measured them;
        # each partition can hold at most one per vertex and one per local edge.
        local = stats.local_combine_rows
        if local is None:
            local = min(stats.num_vertices, math.ceil(stats.num_edges / stats.partitions))
        return cls(
            vertices=scale(stats.num_vertices),
            edges=scale(stats.num_edges),
            mirror=scale_measured(stats.mirror_rows),
            combine=scale_measured(stats.combine_rows),
            in_mirror=scale_measured(stats.in_mirror_rows),
            local_combine=scale(local),
            # The sources of the kept edges: each kept edge brings at most one new source.
            sources=min(stats.num_vertices, scale(stats.num_edges)) if fraction < 1 else stats.num_vertices,
            fraction=fraction,
        )

    def measured(self, name: str) -> int:
        """A count only Spark can measure (`mirror`, `combine`, `in_mirror`), for a program whose
        blocker already checked it is there; a missing one is a planner bug, refused by name."""
        value = getattr(self, name)
        if value is None:
            raise PlanError(f"graph_stats has no '{name}_rows'; the strategy's blocker should have refused it")
        return value

    @property
    def partial(self) -> int:
        """All partial-state rows the source partitions produce (cross-partition + local)."""
        return (self.combine or 0) + self.local_combine


@dataclass(frozen=True)
class LayerContext:
    """Everything a strategy needs to write one layer's operators."""

    spec: LayerSpec
    pre_transform: bool
    widths: LayerWidths
    rows: Rows
    partitions: int
    last: bool
    # why the session cannot run the JVM's native aggregates (pushdown); None when it can
    native_aggregates_missing: str | None = "the session was not checked for the sparkgnn JVM functions"

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def edge_row(self) -> int:
        return edge_row_bytes(self.spec.uses_edge_weight)


@dataclass(frozen=True)
class Program:
    """A layer's operators, unfused. `prefix` is owner-side DL preparation that reads only h^l at
    the vertex's owner partition (+ static edges), so fusion may hoist it into the previous
    layer's pass; `body` is the rest (starts with a Spark operator)."""

    prefix: list[Operator]
    body: list[Operator]


@dataclass(frozen=True)
class Strategy:
    name: str
    edges_by: str
    summary: str
    blocker: Callable[[LayerContext], str | None]
    program: Callable[[LayerContext], Program]
    why: Callable[[LayerContext], str]


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> Strategy:
    if strategy.name in STRATEGIES:
        raise PlanError(f"strategy {strategy.name!r} is already registered")
    if strategy.edges_by not in PARTITIONINGS:
        raise PlanError(f"strategy {strategy.name!r} needs unknown edge partitioning {strategy.edges_by!r}")
    STRATEGIES[strategy.name] = strategy
    return strategy


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise PlanError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None


# ---------------------------------------------------------------- static edge partitionings


def _partition_by_src(stats: GraphStats, edge_row: int) -> Operator:
    return graph(
        "Partition",
        stats.num_edges * edge_row,
        "edges by hash(src) % P, cached once (static, reused by every layer)",
        rows=stats.num_edges,
        key="src",
        static=True,
        reads=["edges"],
        provides=["edges_by_src"],
    )


def _partition_by_dst(stats: GraphStats, edge_row: int) -> Operator:
    routes = (stats.mirror_rows or 0) + stats.num_vertices
    return graph(
        "Partition",
        stats.num_edges * edge_row + routes * ROW_BYTES,
        "edges by hash(dst) % P, cached once (static) + mirror routing table (distinct (src, partition) pairs)",
        rows=stats.num_edges,
        key="dst",
        static=True,
        reads=["edges"],
        provides=["edges_by_dst", "mirror_routes"],
    )


def _partition_by_src_in_spark(stats: GraphStats, edge_row: int) -> Operator:
    return graph(
        "Partition",
        stats.num_edges * edge_row,
        "edges (self-loop policy applied) by hash(src) % P, cached in Spark once: each layer's payloads "
        "join them without moving them",
        rows=stats.num_edges,
        key="src",
        static=True,
        reads=["edges"],
        provides=["edges_by_src_in_spark"],
    )


#: edges_by name -> builder of the one-time Partition operator.
PARTITIONINGS: dict[str, Callable[[GraphStats, int], Operator]] = {
    "src": _partition_by_src,
    "dst": _partition_by_dst,
    "src_in_spark": _partition_by_src_in_spark,
}


# ---------------------------------------------------------------- shared pieces


def layer_key(name: str, layer: int) -> str:
    return f"{name}^{layer}"


def prepare_src_ops(ctx: LayerContext) -> list[Operator]:
    """prepare_src: the payload a source ships along its edges. With transform-then-propagate it
    is h·W (narrower); otherwise h as is, still emitted as its own rows (the executor's steps
    write own rows and payload rows separately, and the first step always runs in Python)."""
    spec, w = ctx.spec, ctx.widths
    what = (
        f"transform before propagating ({spec.src_width.raw} -> {w.src} floats)"
        if ctx.pre_transform
        else f"h as is ({w.src} floats)"
    )
    return [dl("ApplyVertex", f"prepare_src of layer {spec.index}: {what}", rows=ctx.rows.sources, layer=spec.index)]


def update_ops(ctx: LayerContext) -> list[Operator]:
    """The update round trip: state + own row in, h of the next layer out (kept by Spark)."""
    l, v, w = ctx.index, ctx.rows.vertices, ctx.widths
    what = "output (embeddings/predictions)" if ctx.last else f"h^{l + 1}"
    op = dl(
        "ApplyVertex",
        f"finalize + update ({ctx.spec.kind}) + node-wise ops -> {what}, {w.output} floats",
        rows=v,
        layer=l,
    )
    return segment(
        [op],
        layer=l,
        carried=to_python(v, w.state),
        carried_as=layer_key("state", l),
        side={layer_key("own_rows", l): to_python(v, w.in_dim)},
        kept={f"h^{l + 1}": to_python(v, w.output)},
    )


def merge_and_update(ctx: LayerContext, detail: str, rows: int, side: dict[str, int]) -> list[Operator]:
    """The DL side of a layer whose states arrive made (combine, pushdown): one round trip that
    merges the states of each dst (`side`: what Spark ships besides the own rows), then updates."""
    return [
        *segment(
            [dl("Merge", detail, rows=rows, layer=ctx.index)],
            layer=ctx.index,
            side=side,
            intermediate=to_python(ctx.rows.vertices, ctx.widths.state),
        ),
        *update_ops(ctx),
    ]


def aggregate_detail(ctx: LayerContext, where: str) -> str:
    spec, w = ctx.spec, ctx.widths
    extra = f", self_loops={spec.self_loops}" if spec.self_loops not in ("", "none", "None", "False") else ""
    weight = ", edge weights" if spec.uses_edge_weight else ""
    return f"message + {spec.aggregator} aggregation {where} (state {w.state} floats{extra}{weight})"


def whole_neighbourhoods_blocker(ctx: LayerContext) -> str | None:
    """Why a strategy other than replicate cannot run a layer that needs each destination's whole
    in-edge neighbourhood with every source once (LayerSpec.whole_neighbourhoods), or None."""
    if ctx.spec.whole_neighbourhoods:
        return (
            f"{ctx.spec.kind} runs the user's conv on each destination's whole in-edge neighbourhood with every "
            "source once (generic fallback, no partial states); only replicate ships that"
        )
    return None


def edge_attr_blocker(ctx: LayerContext) -> str | None:
    """Why a strategy that forms messages away from the prepared in-edges (combine's out-edge
    partials, pushdown's JVM aggregate) cannot run a layer whose messages read edge attributes."""
    if ctx.spec.edge_attr_dim:
        return (
            f"the messages read edge attributes (edge_attr, {ctx.spec.edge_attr_dim} floats per edge), which "
            "only replicate and edge_join ship with the edges"
        )
    return None


def _single_batch(ctx: LayerContext) -> dict[str, bool]:
    """A non-decomposable aggregation (collect-all path) must see all rows in one batch."""
    return {} if ctx.spec.decomposable else {"single_batch": True}


def owner_prefix(ctx: LayerContext) -> list[Operator]:
    """edge_join/replicate preparation: the source payload, computed at the vertex's owner."""
    l, v, w = ctx.index, ctx.rows.sources, ctx.widths
    return segment(
        prepare_src_ops(ctx),
        layer=l,
        carried=to_python(v, w.input),
        carried_as=f"h^{l}",
        kept={layer_key("src_payload", l): to_python(v, w.src)},
    )


# ---------------------------------------------------------------- edge_join


def _edge_join_program(ctx: LayerContext) -> Program:
    l, r, w = ctx.index, ctx.rows, ctx.widths
    payload = w.src  # the prepared payload, or h itself
    edge_rows = r.edges * (payload * FLOAT_BYTES + ctx.edge_row)
    own = shuffled(r.vertices, w.in_dim)
    side = {layer_key("edge_rows", l): edge_rows}
    if ctx.spec.needs_dst_in_message:
        side[layer_key("own_rows", l)] = to_python(r.vertices, w.in_dim)
    body = [
        graph(
            "Join",
            edge_rows,
            f"edges(by src) with src payload on src ({payload} floats): co-partitioned, no shuffle",
            rows=r.edges,
            layer=l,
            reads=["edges_by_src"],
        ),
        graph(
            "Shuffle",
            edge_rows + own,
            "edge rows + own rows -> partition of dst",
            rows=r.edges + r.vertices,
            layer=l,
            key="dst",
        ),
        graph(
            "Collect",
            edge_rows + own,
            "group each partition's rows into Arrow batches",
            rows=r.edges + r.vertices,
            layer=l,
        ),
        *segment(
            [
                dl(
                    "LocalAggregate",
                    aggregate_detail(ctx, "per dst, all in-edges local"),
                    rows=r.edges,
                    edges=r.edges,
                    layer=l,
                    **_single_batch(ctx),
                )
            ],
            layer=l,
            side=side,
            intermediate=to_python(r.vertices, w.state),
        ),
        *update_ops(ctx),
    ]
    return Program(owner_prefix(ctx), body)


def _edge_join_why(ctx: LayerContext) -> str:
    return (
        f"ships every edge row ({ctx.rows.edges:,} rows of {ctx.widths.src} floats) to its "
        "destination's partition; needs no replication metadata"
    )


register(
    Strategy(
        name="edge_join",
        edges_by="src",
        summary="join edges with h on src, shuffle edge rows by dst",
        blocker=whole_neighbourhoods_blocker,
        program=_edge_join_program,
        why=_edge_join_why,
    )
)


# ---------------------------------------------------------------- replicate


def _replicate_blocker(ctx: LayerContext) -> str | None:
    if ctx.rows.mirror is None:
        return "graph_stats has no 'mirror_rows' (replication needs the mirror count)"
    return None


def _replicate_program(ctx: LayerContext) -> Program:
    l, r, w = ctx.index, ctx.rows, ctx.widths
    mirror = r.measured("mirror")
    payload = w.src  # the prepared payload, or h itself
    mirrors = shuffled(mirror, payload)
    own = shuffled(r.vertices, w.in_dim)
    edges = r.edges * ctx.edge_row
    body = [
        graph(
            "Scatter",
            mirrors,
            f"src payload ({payload} floats) once to every other partition holding an out-edge (mirror routing table)",
            rows=mirror,
            layer=l,
            reads=["mirror_routes"],
        ),
        graph(
            "Shuffle",
            mirrors + own,
            "mirror rows + own rows -> their partitions",
            rows=mirror + r.vertices,
            layer=l,
            key="partition",
        ),
        graph(
            "Collect",
            mirrors + own + edges,
            "with the partition's cached dst-partitioned edges",
            rows=mirror + r.vertices + r.edges,
            layer=l,
            reads=["edges_by_dst"],
        ),
        *segment(
            [
                dl(
                    "LocalAggregate",
                    aggregate_detail(ctx, "per dst, all in-edges local"),
                    rows=r.edges,
                    edges=r.edges,
                    layer=l,
                    **_single_batch(ctx),
                )
            ],
            layer=l,
            side={
                layer_key("mirrors", l): to_python(mirror, payload),
                layer_key("own_rows", l): to_python(r.vertices, w.in_dim),
                "edges_by_dst": edges,
            },
            intermediate=to_python(r.vertices, w.state),
        ),
        *update_ops(ctx),
    ]
    return Program(owner_prefix(ctx), body)


def _replicate_why(ctx: LayerContext) -> str:
    r = ctx.rows
    mirror = r.measured("mirror")
    rf = 1 + mirror / max(r.vertices, 1)
    return (
        f"ships each source once per remote partition holding its out-edges: {mirror:,} "
        f"mirror rows (R_f = {rf:.2f}) instead of {r.edges:,} edge rows"
    )


register(
    Strategy(
        name="replicate",
        edges_by="dst",
        summary="edges static by dst; ship h to mirror partitions",
        blocker=_replicate_blocker,
        program=_replicate_program,
        why=_replicate_why,
    )
)
