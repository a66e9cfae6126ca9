"""Which vertices a request recomputes, layer by layer: the LayerWork lists of HE, SRPE and EXACT
(delta.py evaluates them).

HE     targets = Q at every layer; queries aggregate their in-edges from stored PEs.
SRPE   a set S of existing vertices (chosen by a policy among the candidates) is recomputed at
       layers 1..k-1 from its STORED state merged with the messages of its in-edges from Q only
       (OMEGA section 5: "recomputation includes the edges from query nodes"); everything else
       reuses PEs. Cost: |S| state rows + the query messages, never S's other neighbours.
EXACT  FULL's answer. Vertex w's value at layer l CHANGES iff w was changed at l-1 (its own value
       enters update), an in-edge is new (from Q), or an in-edge's message changed: its source
       changed at l-1, or (layers with statistics, e.g. GCN degrees) its source's statistic
       changed, which happens exactly to the G vertices with request in-edges (D), and for a
       statistic over OUT-edges (ChebConv's degree) to those with request out-edges; with S_l
       those vertices for layer l's statistics (their own update reads them too),
           changed_1 = D  [+ S_1 + out(S_1) with statistics],
           changed_l = changed_{l-1} + D + out(changed_{l-1})  [+ S_l + out(S_l) with statistics].
       Top-down from T_k = Q, a target w of G at layer l is recomputed as
           stored state  + messages of its new in-edges (from Q)
                         + new messages of its changed in-edges - their old messages,
       which needs the current values of changed sources only; those (and w itself when changed)
       become the targets of layer l-1. Aggregators that cannot remove a message (max, softmax)
       recompute w from scratch over all in-edges (stored values of the unchanged sources), and
       so does a layer whose messages read the destination (GAT) when w itself changed, and
       a layer whose self loops take the mean of the in-edges' attributes ("replace_mean", GAT
       with edge_dim) at the G vertices with request in-edges (their loop changed).
"""

from __future__ import annotations

import numpy as np

from sparkgnn.serving.delta import LayerWork, edges_into

EMPTY = np.empty(0, np.int64)


def _query_edges_into(ctx, prep, delta: np.ndarray, offset: int):
    """Request edges from a query into the G vertices `delta` (positions offset + i), with their
    per-edge values (ServingContext.request_edge_values)."""
    n = prep.num_g
    sel = (prep.src >= n) & ctx.sets.member(prep.dst, delta)
    return prep.src[sel], offset + ctx.sets.positions(delta, prep.dst[sel]), ctx.request_edge_values(prep, sel)


def layer_work(
    ctx, prep, conv, layer: int, fresh: np.ndarray, delta: np.ndarray = EMPTY, changed_src: np.ndarray | None = None
) -> LayerWork:
    """Targets fresh (all in-edges, NEW) then delta (stored state + edges from Q, plus, when
    `changed_src` is given, NEW and OLD copies of every in-edge whose source is in it)."""
    targets = np.concatenate([fresh, delta]).astype(np.int64)
    nf = len(fresh)
    weighted = ctx.edge_values(conv)
    if changed_src is None:  # SRPE: never touches delta targets' G in-edges
        src, tgt, w = edges_into(ctx, prep, fresh, conv.self_loops, weighted)
        qs, qt, qw = _query_edges_into(ctx, prep, delta, nf)
        src, tgt = np.concatenate([src, qs]), np.concatenate([tgt, qt])
        if weighted:
            w = np.concatenate([w, qw])
        old = np.zeros(len(src), bool)
    else:
        s, t, w0 = edges_into(ctx, prep, targets, conv.self_loops, weighted)
        on_delta = t >= nf
        changed = on_delta & (s < prep.num_g) & ctx.sets.member(s, changed_src)
        keep_new = ~on_delta | (s >= prep.num_g) | changed
        src = np.concatenate([s[keep_new], s[changed]])
        tgt = np.concatenate([t[keep_new], t[changed]])
        w = None if w0 is None else np.concatenate([w0[keep_new], w0[changed]])
        old = np.concatenate([np.zeros(int(keep_new.sum()), bool), np.ones(int(changed.sum()), bool)])
    from_state = np.concatenate([np.zeros(nf, bool), np.ones(len(delta), bool)])
    return LayerWork(layer, targets, from_state, src, tgt, w if weighted else None, old)


def he_works(ctx, prep, model) -> list:
    q = prep.query_union
    return [layer_work(ctx, prep, conv, l + 1, q) for l, conv in enumerate(model.convs)]


def srpe_works(ctx, prep, model, recompute: np.ndarray) -> list:
    q, k = prep.query_union, model.num_rounds
    recompute = np.asarray(recompute, np.int64)
    works = []
    for l, conv in enumerate(model.convs):
        chosen = recompute if l + 1 < k else EMPTY
        if conv.self_loops == "replace_mean":  # a stored state holds the old loop: from all in-edges
            works.append(layer_work(ctx, prep, conv, l + 1, np.concatenate([q, chosen])))
        else:
            works.append(layer_work(ctx, prep, conv, l + 1, q, chosen))
    return works


def changed_sets(ctx, prep, model) -> list:
    """changed[l] for l = 0..k-1: sorted G vertices whose h^(l) differs from the stored one."""
    n = prep.num_g
    d = ctx.sets.unique(prep.dst[prep.dst < n])
    reached: dict = {}  # S_l -> S_l + out(S_l), per distinct S_l
    changed = [EMPTY]
    for l in range(1, model.num_rounds):
        conv = model.convs[l - 1]
        prev = changed[-1]
        parts = [prev, d, ctx.out_neighbors(prev)]
        if conv.required_stats:
            s = ctx.request_stat_changes(conv, prep)
            key = s.tobytes()
            if key not in reached:
                reached[key] = ctx.sets.unique(s, ctx.out_neighbors(s))
            parts.append(reached[key])
        changed.append(ctx.sets.unique(*parts))
    return changed


def _needs_scratch(ctx, prep, conv, g_targets, changed_src, changed_prev) -> np.ndarray:
    """Targets that cannot take a delta: an aggregator without inverse with a changed in-edge,
    or a destination-reading message (GAT) whose destination changed."""
    scratch = np.zeros(len(g_targets), bool)
    if conv.needs_dst_in_message:
        scratch |= ctx.sets.member(g_targets, changed_prev)
    if conv.self_loops == "replace_mean":  # module doc: their loop's attributes changed
        scratch |= ctx.sets.member(g_targets, prep.dst[prep.dst < prep.num_g])
    if not conv.aggregator.invertible:
        s, t, _ = edges_into(ctx, prep, g_targets, conv.self_loops, False)
        hit = (s < prep.num_g) & ctx.sets.member(s, changed_src)
        scratch |= np.bincount(t[hit], minlength=len(g_targets)) > 0
    return scratch


def exact_works(ctx, prep, model, also: np.ndarray | None = None) -> list:
    """EXACT's works (module doc). `also`: G vertices whose exact value is wanted at every layer
    1..k-1 where they changed (the AE oracle's candidates)."""
    n, k = prep.num_g, model.num_rounds
    q = prep.query_union
    sets = ctx.sets
    changed = changed_sets(ctx, prep, model)
    works: list[LayerWork | None] = [None] * k
    need = EMPTY
    for l in range(k, 0, -1):
        conv = model.convs[l - 1]
        g_targets = need
        if also is not None and l < k:
            g_targets = sets.unique(g_targets, sets.intersect(also, changed[l]))
        changed_src = changed[l - 1]
        if conv.required_stats:  # a source whose statistic changed sends changed messages
            changed_src = sets.unique(changed_src, ctx.request_stat_changes(conv, prep))
        scratch = _needs_scratch(ctx, prep, conv, g_targets, changed_src, changed[l - 1])
        work = layer_work(ctx, prep, conv, l, np.concatenate([q, g_targets[scratch]]), g_targets[~scratch], changed_src)
        works[l - 1] = work
        if l > 1:
            new_src = work.src[~work.old]
            cand = np.concatenate([new_src[new_src < n], g_targets])
            need = sets.intersect(cand, changed[l - 1])
    return works
