"""The `combine` strategy: partial aggregation states formed where the sources live.

Edges are cached by src (`out_edges`); each source partition reduces its out-edges into one partial
state per distinct destination (fused into the previous layer's pass: it reads only h at the
source's owner), only the states of destinations owned elsewhere cross partitions, and the owner
merges them. A message that reads the destination (GAT) costs one more pass: the destination
payloads must reach the source partitions first (`in_targets`). Blocked for non-decomposable
aggregators and data-dependent statistics (the states cannot be formed without them).
"""

from __future__ import annotations

from sparkgnn.planner.ir import Operator
from sparkgnn.planner.segments import dl, graph, segment, shuffled, to_python
from sparkgnn.planner.strategies import (
    DATA_DEPENDENT_STATS,
    LayerContext,
    Program,
    Strategy,
    aggregate_detail,
    edge_attr_blocker,
    layer_key,
    merge_and_update,
    prepare_src_ops,
    register,
    whole_neighbourhoods_blocker,
)


def _combine_blocker(ctx: LayerContext) -> str | None:
    spec, r = ctx.spec, ctx.rows
    whole = whole_neighbourhoods_blocker(ctx) or edge_attr_blocker(ctx)
    if whole:
        return whole
    if not spec.decomposable:
        return f"aggregator {spec.aggregator!r} is not decomposable: partial states cannot be merged"
    dependent = sorted(set(spec.required_stats) & DATA_DEPENDENT_STATS)
    if dependent:
        return (
            f"the aggregation needs the neighbourhood statistic(s) {dependent} before partial "
            "states can be formed at the source partitions"
        )
    if r.combine is None:
        return "graph_stats has no 'combine_rows' (the combiner needs the cross-partition partial count)"
    if spec.needs_dst_in_message and r.in_mirror is None:
        return "the message needs the destination's payload but graph_stats has no 'in_mirror_rows'"
    return None


def _combine_prefix(ctx: LayerContext) -> list[Operator]:
    """Owner-side work for combine. Without a dst-dependent message the partial aggregation
    itself reads only h at the source's owner + its cached out-edges, so it is part of the
    prefix (fusion runs it in the previous layer's pass). With one (GAT) only the payloads are."""
    l, r, w, spec = ctx.index, ctx.rows, ctx.widths, ctx.spec
    ops = prepare_src_ops(ctx)
    if spec.needs_dst_in_message:
        ops.append(
            dl(
                "ApplyVertex",
                f"prepare_dst of layer {l}: destination payload ({w.dst} floats)",
                rows=r.vertices,
                layer=l,
            )
        )
        kept = {
            layer_key("dst_payload", l): to_python(r.vertices, w.dst),
            layer_key("src_payload", l): to_python(r.sources, w.src),
        }
        return segment(ops, layer=l, carried=to_python(r.sources, w.input), carried_as=f"h^{l}", kept=kept)
    ops.append(
        dl(
            "LocalAggregate",
            aggregate_detail(ctx, "into partial states per distinct dst of this src partition"),
            rows=r.edges,
            edges=r.edges,
            layer=l,
        )
    )
    return segment(
        ops,
        layer=l,
        carried=to_python(r.sources, w.input),
        carried_as=f"h^{l}",
        side={"edges_by_src": r.edges * ctx.edge_row},
        kept={layer_key("partials", l): shuffled(r.partial, w.state)},
    )


def _combine_program(ctx: LayerContext) -> Program:
    l, r, w, spec = ctx.index, ctx.rows, ctx.widths, ctx.spec
    combine = r.measured("combine")
    body: list[Operator] = []
    if spec.needs_dst_in_message:
        in_mirror = r.measured("in_mirror")
        dst_rows = shuffled(in_mirror, w.dst)
        edges = r.edges * ctx.edge_row
        body += [
            graph(
                "Scatter",
                dst_rows,
                f"dst payload ({w.dst} floats) to every other partition holding an in-edge (edges by src)",
                rows=in_mirror,
                layer=l,
                reads=["edges_by_src"],
            ),
            graph(
                "Shuffle",
                dst_rows,
                "in-mirror rows -> partitions of the sources",
                rows=in_mirror,
                layer=l,
                key="partition",
            ),
            graph(
                "Collect",
                dst_rows + edges,
                "with the partition's cached src-partitioned edges",
                rows=in_mirror + r.edges,
                layer=l,
                reads=["edges_by_src"],
            ),
            *segment(
                [
                    dl(
                        "LocalAggregate",
                        aggregate_detail(ctx, "into partial states per distinct dst of this src partition"),
                        rows=r.edges,
                        edges=r.edges,
                        layer=l,
                    )
                ],
                layer=l,
                side={
                    layer_key("in_mirrors", l): to_python(in_mirror, w.dst),
                    layer_key("src_payload", l): to_python(r.sources, w.src),
                    layer_key("dst_payload", l): to_python(r.vertices, w.dst),
                    "edges_by_src": edges,
                },
                kept={layer_key("partials", l): shuffled(r.partial, w.state)},
            ),
        ]
    crossing = shuffled(combine, w.state)
    local = shuffled(r.local_combine, w.state)
    own = shuffled(r.vertices, w.in_dim)
    body += [
        graph(
            "Shuffle",
            crossing + own,
            "cross-partition partial states + own rows -> partition of dst (local partials stay put)",
            rows=combine + r.vertices,
            layer=l,
            key="dst",
        ),
        graph(
            "Collect",
            crossing + own + local,
            "with the partition's local partial states",
            rows=r.partial + r.vertices,
            layer=l,
        ),
        *merge_and_update(
            ctx,
            f"merge partial states per dst ({spec.aggregator}, associative)",
            r.partial,
            {layer_key("partials", l): to_python(r.partial, w.state)},
        ),
    ]
    return Program(_combine_prefix(ctx), body)


def _combine_why(ctx: LayerContext) -> str:
    r = ctx.rows
    combine = r.measured("combine")
    share = combine / max(r.edges, 1)
    text = (
        f"pre-aggregates where the sources live: {combine:,} partial states of "
        f"{ctx.widths.state} floats cross partitions ({share:.0%} of the {r.edges:,} edges)"
    )
    if ctx.spec.needs_dst_in_message:
        text += f", after {r.measured('in_mirror'):,} dst payload rows reach the source partitions (one extra pass)"
    return text


register(
    Strategy(
        name="combine",
        edges_by="src",
        summary="partial states at src partitions, shuffle partials, merge at dst",
        blocker=_combine_blocker,
        program=_combine_program,
        why=_combine_why,
    )
)
