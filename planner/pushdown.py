"""The `pushdown` strategy: the graph engine forms and aggregates a layer's messages itself.

Lotan's plan rewrite (../shared/papers/002, §4.2 "Plan Generation and Rewrites", figure 5): when a
layer's message and aggregation carry no weights, they need not run in the DL engine. Here that
holds when the message is a scaled source payload (`message_scaled`: weight x payload, GCN /
SAGE / GIN; with transform-then-propagate the payload is already h·W) and the aggregator has a
native aggregate in the sparkgnn JVM module (engine.jvm, jvm/): sum -> [s], mean -> [s | n],
max / min -> [m], the engine's own state layouts. So:

  owner (DL, fused into the previous pass)  prepare_src: the payload of each own vertex, to Spark
  Spark  payloads by hash(src) -> hash join with the edges cached by src (they never move again)
         -> native aggregate per dst over each src partition's edges (Spark's partial aggregation)
         -> partial states shuffled by dst -> merged -> one state row per dst, routed to its owner
  owner (DL)  finalize + update, exactly as combine's merge step (aggregate=states)

Bytes: payloads once (|V| rows) + partial states (what combine ships) + one state per vertex;
the edges cross Python never and the shuffle once (cached). The price is the JVM's per-edge work
(`jvm_edges`, CostModel.jvm_edge_s) and one more shuffle than combine.
"""

from __future__ import annotations

from sparkgnn.planner.segments import FLOAT_BYTES, ROW_BYTES, graph, shuffled, to_python
from sparkgnn.planner.strategies import (
    DATA_DEPENDENT_STATS,
    LayerContext,
    Program,
    Strategy,
    edge_attr_blocker,
    layer_key,
    merge_and_update,
    owner_prefix,
    register,
    whole_neighbourhoods_blocker,
)

#: Aggregator name -> (SQL function of the JVM module, extra state floats beyond the message).
NATIVE_AGGREGATES: dict[str, tuple[str, int]] = {
    "sum": ("sparkgnn_vec_sum", 0),
    "mean": ("sparkgnn_vec_sum_count", 1),
    "max": ("sparkgnn_vec_max", 0),
    "min": ("sparkgnn_vec_min", 0),
}


def buffer_row_bytes(width: int) -> int:
    """A partial state as Spark shuffles it: the native aggregate's buffer (two floats per 8-byte
    field + the count, jvm/VectorAggregate.scala) plus the grouping key and row header."""
    return 8 * ((width + 1) // 2 + 1) + ROW_BYTES


def _blocker(ctx: LayerContext) -> str | None:
    spec, r = ctx.spec, ctx.rows
    whole = whole_neighbourhoods_blocker(ctx) or edge_attr_blocker(ctx)
    if whole:
        return whole
    if ctx.native_aggregates_missing:
        return ctx.native_aggregates_missing
    if spec.needs_dst_in_message:
        return "the message reads the destination's payload (only the DL engine can form it)"
    if not spec.message_scaled:
        return "the message is not a scaled source payload (it needs the layer's own code)"
    if spec.aggregator not in NATIVE_AGGREGATES:
        return f"no native aggregate for {spec.aggregator!r} (the JVM module has {', '.join(NATIVE_AGGREGATES)})"
    _, extra = NATIVE_AGGREGATES[spec.aggregator]
    if ctx.widths.state != ctx.widths.src + extra:
        return f"state width {ctx.widths.state} is not the native aggregate's ({ctx.widths.src + extra})"
    dependent = sorted(set(spec.required_stats) & DATA_DEPENDENT_STATS)
    if dependent:
        return f"the aggregation needs the neighbourhood statistic(s) {dependent} first"
    if r.combine is None:
        return "graph_stats has no 'combine_rows' (the partial-state count)"
    return None


def _program(ctx: LayerContext) -> Program:
    l, r, w, spec = ctx.index, ctx.rows, ctx.widths, ctx.spec
    function, _ = NATIVE_AGGREGATES[spec.aggregator]
    payloads = shuffled(r.sources, w.src)
    partials = r.partial * buffer_row_bytes(w.src)
    states = shuffled(r.vertices, w.state)
    own = shuffled(r.vertices, w.in_dim)
    weight = ", weight" if spec.uses_edge_weight else ""
    body = [
        graph(
            "Shuffle",
            payloads,
            f"src payloads ({w.src} floats, packed) -> hash(src) % P, where their out-edges are cached",
            rows=r.sources,
            layer=l,
            key="src",
        ),
        graph(
            "Join",
            r.edges * (w.src * FLOAT_BYTES + ctx.edge_row),
            "cached edges with the payload of their src (shuffled hash join: the edges stay put)",
            rows=r.edges,
            layer=l,
            reads=["edges_by_src_in_spark"],
        ),
        graph(
            "LocalAggregate",
            0,
            f"{function}(payload, {w.src}{weight}) per dst over each src partition's edges "
            f"(JVM, Spark's partial aggregation; self_loops={spec.self_loops})",
            rows=r.edges,
            layer=l,
            jvm_edges=r.edges,
            function=function,
            width=w.src,
            weighted=spec.uses_edge_weight,
            self_loops=spec.self_loops,
        ),
        graph(
            "Shuffle",
            partials,
            f"partial states -> hash(dst) ({w.state} floats as {buffer_row_bytes(w.src)}-byte buffers)",
            rows=r.partial,
            layer=l,
            key="dst",
        ),
        graph("Merge", 0, f"{function}: merge the partial states of each dst (JVM)", rows=r.partial, layer=l),
        graph(
            "Shuffle",
            states + own,
            "one state per dst + own rows -> partition of dst",
            rows=2 * r.vertices,
            layer=l,
            key="dst",
        ),
        graph("Collect", states + own, "group each partition's rows into Arrow batches", rows=2 * r.vertices, layer=l),
        *merge_and_update(
            ctx,
            f"finalize the {spec.aggregator} state of each dst (one per dst)",
            r.vertices,
            {layer_key("states", l): to_python(r.vertices, w.state)},
        ),
    ]
    return Program(owner_prefix(ctx), body)


def _why(ctx: LayerContext) -> str:
    function, _ = NATIVE_AGGREGATES[ctx.spec.aggregator]
    return (
        f"aggregates {ctx.rows.edges:,} edges in Spark with {function}: only the payloads, "
        f"{ctx.rows.partial:,} partial states and one state per vertex move; no edge enters Python"
    )


register(
    Strategy(
        name="pushdown",
        edges_by="src_in_spark",
        summary="message + aggregation in Spark (native aggregates over cached edges), update in the DL engine",
        blocker=_blocker,
        program=_program,
        why=_why,
    )
)
