"""Cheap pre-run size estimates of a request's exact plans (FULL and EXACT), for mode="auto".

WHY estimate instead of measure: measuring FULL's sizes means building its k-hop computation graph,
measuring EXACT's means building its LayerWork lists; each costs about the plan's own planning
share, more than the 10% auto may lose when the OTHER mode wins (figures in docs/ARCHITECTURE.md,
"Serving plans in the IR and mode="auto""). The sketch reads only what is proportional to the REQUEST:
its edges, the distinct in-neighbours H1 of Q and the G vertices D its edges point into, and G's
degree array at those vertices (O(B + request edges + |H1|) numpy work). What lies
further out is extrapolated from per-graph statistics computed once (`GraphSketch`):

  kappa      mean in-degree of the SOURCE of a random edge (sum_v in(v) out(v) / E): the expected
             in-edges gathered per vertex reached by walking an edge backwards
  occupancy  distinct vertices hit by m edges drawn at random (weights out(v)/E for sources,
             in(v)/E for destinations): sum_v 1 - exp(-m w_v), tabulated on a log grid of m

FULL (k layers): H1 and the edges into Q and H1 are exact; every further hop h adds
occupancy(edges drawn so far) - |H_<h| vertices, each bringing kappa in-edges. For k = 2 only the
number of feature rows (layer 0's vertices) is extrapolated.
  closure    how much more often than at random a query's in-neighbour has an in-edge from a vertex
             the query points to (clustering), measured once on a few pseudo-requests

EXACT: the top layer (Q's in-edges) is exact; a vertex u of H1 is recomputed below iff it changed:
certainly when u is in D or in a layer's S_l (below), else with probability 1 - (1 - s)^in(u), where
s = 1 - exp(-closure S / E) is the share of in-edges sent by the changed sources and S their
out-degree sum; each recomputed vertex adds its request in-edges and, where sources changed,
in(u) s new + as many old messages. A layer with statistics also changes the messages of S_l, the
G vertices whose statistic the request changes (plans.py, the same sets through
ServingContext.request_stat_changes): D for in-edge statistics (GCN degrees), the G sources of
request edges for out-edge ones (ChebConv's degree: all of H1, so every in-neighbour of a query is
recomputed), whose out-degree sums count among the changed sources. Layers
below k-1 reuse the k-1 estimate (the targets of EXACT stay within H1's changed part; the
bench's recomputed_per_layer shows equal counts; with statistics and k >= 3 the 2-hop sources of
changed in-edges also become targets below, which the sketch leaves out: an under-estimate,
largest for ChebConv, whose K-1 rounds per conv make k large).
Graph clustering makes real neighbourhoods overlap more than random draws, so FULL's
far hops are over- rather than under-estimated; tests/serving/test_auto_mode.py checks the
estimates against measured sizes.
"""

from __future__ import annotations

import numpy as np

from sparkgnn import npsets
from sparkgnn.planner.serving import RequestCounts
from sparkgnn.registry import Registry
from sparkgnn.serving.modes import ModeError
from sparkgnn.serving.sizes import FLOAT_BYTES, layer_counts, loop_edges

GRID_POINTS = 97


class GraphSketch:
    """Per-graph statistics of the sketch (module doc), built once per ServingContext."""

    def __init__(self, ctx):
        g = ctx.graph
        n = g.num_nodes
        self.num_nodes = n
        self.in_deg = ctx.g_in_degree().astype(np.int64)
        self.out_deg = np.bincount(g.edge_src, minlength=n).astype(np.int64)
        e = max(int(self.in_deg.sum()), 1)
        self.num_edges = e
        self.kappa = float((self.in_deg * self.out_deg).sum()) / e
        self.grid = np.concatenate([[0.0], np.geomspace(1.0, 64.0 * e, GRID_POINTS - 1)])
        self._occ_src = self._occupancy(self.out_deg / e)
        self._occ_dst = self._occupancy(self.in_deg / e)
        self.closure = self._closure(ctx)

    def _occupancy(self, w: np.ndarray) -> np.ndarray:
        w = w[w > 0]
        return np.array([float((-np.expm1(-m * w)).sum()) for m in self.grid])

    def _closure(self, ctx, samples: int = 8, size: int = 32, seed: int = 0) -> float:
        """How much more often than at random an in-edge of a query's in-neighbour comes from a
        vertex the query points to (clustering: neighbours of neighbours are neighbours). Measured
        once on `samples` pseudo-requests of `size` random G vertices: edges from D = out(Q) into
        H1 = in(Q), over their random-model expectation sum_{u in H1} in(u) out(D) / E. The sketch
        then takes 1 - exp(-closure x out(S) / E) as the share of an in-edge list that S sends."""
        rng = np.random.default_rng(seed)
        n = self.num_nodes
        if n == 0:
            return 1.0
        actual = expected = 0.0
        for _ in range(samples):
            q = npsets.unique(rng.integers(0, n, size=min(size, n)))
            h1 = npsets.unique(ctx.in_src[ctx_range(ctx.indptr, q)])
            d = ctx.out_neighbors(q)
            if not len(h1) or not len(d):
                continue
            src = ctx.in_src[ctx_range(ctx.indptr, h1)]
            actual += float(ctx.sets.member(src, d).sum())
            expected += float(self.in_deg[h1].sum()) * float(self.out_deg[d].sum()) / self.num_edges
        return max(1.0, actual / expected) if expected > 0 else 1.0

    def share(self, out_sum: float) -> float:
        """Expected share of a vertex's in-edges sent by a set with out-degree sum `out_sum`."""
        return float(-np.expm1(-self.closure * out_sum / self.num_edges))

    def distinct_sources(self, m: float) -> float:
        """Expected distinct sources of m random edges."""
        return float(np.interp(m, self.grid, self._occ_src))

    def distinct_targets(self, m: float) -> float:
        """Expected distinct destinations of m random edges."""
        return float(np.interp(m, self.grid, self._occ_dst))


def ctx_range(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    from sparkgnn.serving.context import range_gather

    return range_gather(indptr, np.asarray(rows, np.int64))[0]


def graph_sketch(ctx) -> GraphSketch:
    return ctx.cached("graph_sketch", lambda: GraphSketch(ctx))


class _RequestView:
    """The request-proportional facts both estimates share (module doc)."""

    def __init__(self, ctx, prep):
        n = prep.num_g
        sets = ctx.sets
        into_q = prep.dst >= n
        q_src = prep.src[into_q]
        self.r_q = int(into_q.sum())
        self.g_draws = int((q_src < n).sum())
        self.h1 = sets.unique(q_src[q_src < n])
        into_g = prep.dst < n
        self.d = sets.unique(prep.dst[into_g])
        # request in-edges per H1 vertex
        pos = sets.positions(self.h1, prep.dst[into_g]) if len(self.h1) else np.empty(0, np.int64)
        self.req_into_h1 = np.bincount(pos[pos >= 0], minlength=len(self.h1)).astype(np.float64)


def sketch_full(ctx, prep, model) -> RequestCounts:
    """FULL's sizes estimated (module doc)."""
    gs = graph_sketch(ctx)
    v = _RequestView(ctx, prep)
    n, b, k = gs.num_nodes, prep.batch_size, model.num_rounds
    deg_h1 = gs.in_deg[v.h1].astype(np.float64)
    reached = [0.0, float(len(v.h1))]  # G vertices within hop h (h = 0, 1, ...)
    edges_into = [float(v.r_q), float(deg_h1.sum() + v.req_into_h1.sum())]  # in-edges of hop h
    drawn = v.g_draws + float(deg_h1.sum())
    for _ in range(2, k + 1):
        reach = min(float(n), max(reached[-1], gs.distinct_sources(drawn)))
        new_edges = (reach - reached[-1]) * gs.kappa
        reached.append(reach)
        edges_into.append(new_edges)
        drawn += new_edges
    x_bytes = int(ctx.graph.x.dtype.itemsize) * int(ctx.graph.x.shape[1])
    layers = []
    for l, conv in enumerate(model.convs, start=1):
        pre = model.choose_pre_transform(conv)
        n_in, n_out = b + reached[k - l + 1], b + reached[k - l]
        edges = sum(edges_into[: k - l + 1])
        first = l == 1
        layers.append(
            layer_counts(
                conv,
                l,
                pre,
                targets=n_out,
                rows_in=n_in if pre else n_out,
                edges=edges + loop_edges(conv, n_out),
                rows_loaded=reached[k] if first else 0,
                bytes_loaded=reached[k] * x_bytes if first else 0,
                index_edges=edges if first else 0,
            )
        )
    return RequestCounts("full", "recompute", b, len(prep.src), tuple(layers), estimated=True, detail="sketch")


def _stat_changes(ctx, prep, model) -> list[np.ndarray]:
    """S_l (l = 1..k; index 0 unused): the G vertices whose statistics of layer l the request
    changes (ServingContext.request_stat_changes, as plans.changed_sets uses them): D for in-edge
    statistics (GCN degrees), the G sources of request edges for out-edge ones (ChebConv), empty
    without statistics. Request-proportional: a pass over the request's edges per layer."""
    empty = np.empty(0, np.int64)
    return [empty] + [ctx.request_stat_changes(conv, prep) if conv.required_stats else empty for conv in model.convs]


def _reaching_out_sums(
    ctx, gs: GraphSketch, v: _RequestView, model, stat_sets: list[np.ndarray]
) -> tuple[list[float], list[np.ndarray]]:
    """(reach, certain). reach[l] (l = 1..k): out-degree sum of the sources whose messages change
    at layer l, which are also the vertices whose out-neighbours join changed[l]
    (plans.changed_sets): changed[l-1] plus S_l (`stat_sets`) for a layer with statistics, S_l's
    part outside changed[l-1] counted once. certain[l] (l = 1..k-1): the G vertices in changed[l]
    for certain, D and every S_j (j <= l), whose own values and degrees are known; the rest of
    changed[l] is extrapolated (out-neighbours reached, kappa out-edges each). Index 0 unused."""
    n = float(gs.num_nodes)
    sets = ctx.sets
    changed_out, size = 0.0, 0.0
    prev_certain = np.empty(0, np.int64)  # changed[0] is empty
    reach, certain = [0.0], [prev_certain]
    for l in range(1, model.num_rounds + 1):
        s_new = stat_sets[l][~sets.member(stat_sets[l], prev_certain)] if len(prev_certain) else stat_sets[l]
        reach.append(changed_out + float(gs.out_deg[s_new].sum()))
        if l == model.num_rounds:
            break
        now = sets.unique(prev_certain, v.d, stat_sets[l])
        size = min(n, max(size, len(now) + gs.distinct_targets(reach[l])))
        changed_out = float(gs.out_deg[now].sum()) + max(size - len(now), 0.0) * gs.kappa
        certain.append(now)
        prev_certain = now
    return reach, certain


def sketch_exact(ctx, prep, model, partitions: int = 1) -> RequestCounts:
    """EXACT's sizes estimated (module doc)."""
    gs = graph_sketch(ctx)
    v = _RequestView(ctx, prep)
    n, b, k = gs.num_nodes, prep.batch_size, model.num_rounds
    deg_h1 = gs.in_deg[v.h1].astype(np.float64)
    reach, certain = _reaching_out_sums(ctx, gs, v, model, _stat_changes(ctx, prep, model))
    # p[l][u]: probability that H1 vertex u is recomputed at layer l (top-down: within layer
    # l+1's targets and changed at l); layer k recomputes the queries only
    p = {k: np.zeros(len(v.h1))}
    for l in range(k - 1, 0, -1):
        sure = ctx.sets.member(v.h1, certain[l]) if len(v.h1) else np.zeros(0, bool)
        changed = np.where(sure, 1.0, 1.0 - (1.0 - gs.share(reach[l])) ** deg_h1)
        p[l] = changed if l == k - 1 else np.minimum(changed, p[l + 1])
    p[0] = np.zeros(len(v.h1))
    layers = []
    for l, conv in enumerate(model.convs, start=1):
        # out-degree sum of the sources whose messages changed: changed[l-1] (+ S_l with statistics)
        frac = gs.share(reach[l])
        need = float(p[l].sum())
        all_in = float((p[l] * deg_h1).sum())
        scratch = (not conv.aggregator.invertible and frac > 0) or (conv.needs_dst_in_message and l > 1)
        if scratch:
            new, old, from_state = v.r_q + all_in + float((p[l] * v.req_into_h1).sum()), 0.0, 0.0
            new += loop_edges(conv, b + need)
        else:
            changed_edges = all_in * frac
            new = v.r_q + float((p[l] * v.req_into_h1).sum()) + changed_edges + loop_edges(conv, b)
            old, from_state = changed_edges, need
        # stored values read: Q's G in-neighbours not recomputed below, old sources, own values
        q_sources = len(v.h1) - float(p[l - 1].sum())
        value_rows = q_sources + min(old, float(n)) + float(np.maximum(p[l] - p[l - 1], 0.0).sum())
        layers.append(
            layer_counts(
                conv,
                l,
                False,
                targets=b + need,
                from_state=from_state,
                rows_in=b + need,
                edges=new,
                old_edges=old,
                rows_loaded=value_rows + from_state,
                bytes_loaded=FLOAT_BYTES * (value_rows * conv.in_dim + from_state * conv.state_width(False)),
                index_edges=all_in + new + old,
            )
        )
    return RequestCounts(
        "exact",
        "delta",
        b,
        len(prep.src),
        tuple(layers),
        partitions=max(1, int(partitions)),
        estimated=True,
        detail="sketch",
    )


#: The exact plans mode="auto" chooses between: mode name -> sketch(ctx, prep, model, partitions).
EXACT_PLANS: Registry = Registry("exact serving plan", ModeError)
EXACT_PLANS.register("exact", sketch_exact)
EXACT_PLANS.register("full", lambda ctx, prep, model, partitions=1: sketch_full(ctx, prep, model))
