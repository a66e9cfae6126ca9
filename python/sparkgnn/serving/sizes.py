"""A request's measured sizes, per layer, as the planner's plain data (planner.serving.RequestCounts).

WHY a module of its own: the planner is torch-free and knows nothing of computation graphs or
LayerWork; the serving modes know their sizes only as arrays. These functions read the arrays a
mode has already built (FULL/NS: the CompGraph; HE/SRPE/EXACT: the LayerWork lists) and count
what the cost model charges: targets, messages (new and old), rows and bytes loaded from storage,
dense transform rows, and the CSC entries the planning step gathered. serving/sketch.py estimates
the same quantities BEFORE the arrays exist (for mode="auto"); both must count alike, so the
definitions live next to each other in `layer_counts`.
"""

from __future__ import annotations

import numpy as np

from sparkgnn.planner.serving import LayerCounts, RequestCounts

FLOAT_BYTES = 4


def loop_edges(conv, targets: int) -> int:
    """Self loops the conv's policy adds (one per target unless the policy is "none")."""
    return 0 if conv.self_loops == "none" else int(targets)


def layer_counts(conv, layer: int, pre_transform: bool, **sizes) -> LayerCounts:
    """LayerCounts of `conv` at `layer` (1..k) from the sizes given as keywords (module doc)."""
    return LayerCounts(
        layer=layer,
        kind=conv.kind,
        in_dim=int(conv.in_dim),
        out_dim=int(conv.out_dim),
        msg_width=int(conv.msg_width(pre_transform)),
        aggregator=conv.aggregator.name,
        pre_transform=bool(pre_transform),
        **{k: int(round(float(v))) for k, v in sizes.items()},
    )


def recompute_counts(ctx, model, prep, cg, mode: str) -> RequestCounts:
    """FULL / NS over computation graph `cg` (compgraph.py): layer l runs on the prefix of
    cg.sizes[l-1] inputs and cg.sizes[l] outputs; layer 1 reads the raw features of the G rows."""
    b = prep.batch_size
    x_bytes = int(ctx.graph.x.dtype.itemsize) * int(ctx.graph.x.shape[1])
    layers = []
    for l, conv in enumerate(model.convs, start=1):
        pre = model.choose_pre_transform(conv)
        n_in, n_out = cg.sizes[l - 1], cg.sizes[l]
        first = l == 1
        layers.append(
            layer_counts(
                conv,
                l,
                pre,
                targets=n_out,
                rows_in=n_in if pre else n_out,
                edges=cg.num_edges_into(n_out) + loop_edges(conv, n_out),
                rows_loaded=(cg.sizes[0] - b) if first else 0,
                bytes_loaded=(cg.sizes[0] - b) * x_bytes if first else 0,
                index_edges=len(cg.src) if first else 0,
            )
        )
    return RequestCounts(mode, "recompute", b, len(prep.src), tuple(layers))


def delta_counts(ctx, model, prep, works, mode: str, partitions: int = 1) -> RequestCounts:
    """HE / SRPE / EXACT from their LayerWork lists (delta.py): every layer runs raw (stored
    states are in raw message space). Rows loaded at layer l: stored values of the distinct
    sources of new messages that are neither queries nor recomputed at l-1, the sources of old
    messages, the targets' own values when not recomputed at l-1, and the stored states."""
    n, b = prep.num_g, prep.batch_size
    sets = ctx.sets
    in_deg = ctx.g_in_degree()
    layers = []
    prev = np.empty(0, np.int64)
    for work, conv in zip(works, model.convs, strict=True):
        g_targets = work.targets[work.targets < n]
        new_src = sets.unique(work.src[~work.old])
        new_src = new_src[new_src < n]
        fetched_new = int((~sets.member(new_src, prev)).sum()) if len(prev) else len(new_src)
        old_src = len(sets.unique(work.src[work.old])) if work.old.any() else 0
        own = int((~sets.member(g_targets, prev)).sum()) if len(prev) else len(g_targets)
        from_state = int(work.from_state.sum())
        value_rows = fetched_new + old_src + own
        layers.append(
            layer_counts(
                conv,
                work.layer,
                False,
                targets=len(work.targets),
                from_state=from_state,
                rows_in=len(work.targets),
                edges=int((~work.old).sum()),
                old_edges=int(work.old.sum()),
                rows_loaded=value_rows + from_state,
                bytes_loaded=FLOAT_BYTES * (value_rows * conv.in_dim + from_state * conv.state_width(False)),
                index_edges=int(in_deg[g_targets].sum()) + len(work.src),
            )
        )
        prev = sets.unique(work.targets)
    return RequestCounts(mode, "delta", b, len(prep.src), tuple(layers), partitions=max(1, int(partitions)))
