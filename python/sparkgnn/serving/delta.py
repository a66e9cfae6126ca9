"""Layer-by-layer recomputation of a few vertices from stored PEs and stored partial states: the
execution core shared by HE, SRPE and EXACT (and by computation graph parallelism).

A mode describes a request as one LayerWork per layer l = 1..k:

    targets     the union vertices whose h^(l) is computed at layer l (queries always; vertices of G
                that the mode recomputes); every other vertex keeps its stored h^(l)
    from_state  per target: start from its STORED merged state of layer l (a vertex of G whose
                in-edges mostly did not change) instead of from nothing (queries, and vertices
                whose aggregator cannot take a delta)
    edges       in-edges of targets to aggregate (self-loop policy already applied), each either
                NEW (message from the vertices' current values, merged in) or OLD (message from
                the stored values, merged in negated: it removes a contribution that changed)

and the executor evaluates, for every target t:

    h_t^(l) = post_l(update(h_t^(l-1), finalize(merge(stored_state_t?, partial(new), -partial(old)))))

"Current value" of a source u at layer l-1: its recomputed value if u is a target of layer l-1,
else the stored one (PE h^(l-1), or pre(x) at layer 0); queries are targets at every layer.
Statistics (GCN degrees) of NEW messages are those of the union graph, of OLD ones those of G.
Stored states are in raw message space (no transform-then-propagate), so every layer runs raw.

Computation graph parallelism (OMEGA section 6) is the same computation split by ownership:
`partitions` P > 1 assigns each vertex of G to partition id mod P and query i to i mod P; an
edge is aggregated by its SOURCE's partition, each partition's partial states go to the target's
owner, owners merge them with the stored state they hold and apply update, and the new values
are all-gathered for the next layer. The per-partition work, the merge and the exchanged bytes
are cgp_kernel.py's (the same kernel the Spark and messenger executors run). Because merge is
associative and commutative the answer equals P = 1 up to float summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sparkgnn.layers.selfloops import apply_policy_to_targets
from sparkgnn.serving.cgp_kernel import count_layer, merge_partials, no_exchange, owner_of, partition_partials
from sparkgnn.serving.context import Meter, PreparedRequest, ServingContext


@dataclass
class LayerWork:
    layer: int  # 1..k
    targets: np.ndarray  # union indices, queries first
    from_state: np.ndarray  # bool [T]
    src: np.ndarray  # union index of each edge's source
    tgt: np.ndarray  # position in `targets` of each edge's destination
    weight: np.ndarray | None
    old: np.ndarray  # bool [E]: message from stored values, subtracted


def edges_into(ctx: ServingContext, prep: PreparedRequest, targets: np.ndarray, policy: str, values: bool = True):
    """All in-edges of the union vertices `targets` (G's in-edges + request edges), with the
    conv's self-loop policy applied exactly as on the whole union graph: policies only add or
    drop loops of the destinations, and a destination's loops are among its in-edges. Returns
    (src union index, target position, per-edge value or None); `values` False (a conv that
    does not read the context's per-edge values, ServingContext.edge_values) drops them first."""
    sets = ctx.sets
    src, dst, w = ctx.in_edges(prep, targets)
    w = w if values else None
    tgt = sets.positions(targets, dst)
    return apply_policy_to_targets(
        src, tgt, w, targets, policy, positions=sets.positions, unique_inverse=sets.unique_inverse
    )


def _float32(t: torch.Tensor) -> torch.Tensor:
    """`t` as float32 (itself when it is: a gather made it a copy already)."""
    return t if t.dtype == torch.float32 else t.to(torch.float32)


class LayerExecutor:
    """Evaluates a list of LayerWork bottom-up (module doc). `stored` is a StoredLayers."""

    def __init__(self, ctx: ServingContext, model, stored, parts: int = 1):
        self.ctx, self.model, self.stored, self.parts = ctx, model, stored, max(1, int(parts))

    # -- values ------------------------------------------------------------------------------
    def _values(
        self, layer_prev: int, nodes: np.ndarray, prev_targets, prev_h, x_query, prep, meter: Meter
    ) -> torch.Tensor:
        """Current value at layer `layer_prev` of union vertices `nodes` (see module doc)."""
        # WHY integer row indices and whole-array fast paths: a request's layers call this a few
        # times each, on a few rows; boolean-mask assignment (a nonzero per mask) was most of it
        n = self.ctx.num_nodes
        if prev_targets is not None and len(prev_targets):
            pos = self.ctx.sets.positions(prev_targets, nodes)
        else:
            pos = np.full(len(nodes), -1, np.int64)
        hit = pos >= 0
        is_q = nodes >= n
        q_only = is_q & ~hit
        if q_only.any() and layer_prev != 0:
            raise AssertionError("a query's value must come from the previous layer's targets")
        rest = ~hit & ~is_q
        width = prev_h.shape[1] if prev_h is not None else x_query.shape[1]
        if not len(nodes):
            return torch.empty(0, width, dtype=torch.float32)
        if hit.all():  # every row computed one layer down (a copy: indexing gathers)
            return _float32(prev_h[torch.from_numpy(pos)])
        if q_only.all():
            return _float32(x_query[torch.from_numpy(nodes - n)])
        if rest.all():
            with meter.timer("fetch_s"):
                return self.stored.value(layer_prev, nodes, meter).to(torch.float32, copy=True)
        out = torch.empty(len(nodes), width, dtype=torch.float32)
        rows = np.flatnonzero(hit)
        if len(rows):
            out[torch.from_numpy(rows)] = prev_h[torch.from_numpy(pos[rows])]
        rows = np.flatnonzero(q_only)
        if len(rows):
            out[torch.from_numpy(rows)] = x_query[torch.from_numpy(nodes[rows] - n)]
        rows = np.flatnonzero(rest)
        if len(rows):
            with meter.timer("fetch_s"):
                out[torch.from_numpy(rows)] = self.stored.value(layer_prev, nodes[rows], meter)
        return out

    def _stats(self, conv, prep, nodes: np.ndarray, old: bool) -> dict:
        if not conv.required_stats:
            return {}
        if old:
            rows = torch.from_numpy(nodes)
            return {
                name: self.ctx.g_stat(name, conv.uses_edge_weight)[rows].to(torch.float32)
                for name in conv.required_stats
            }
        return self.ctx.union_stats(conv, prep, nodes)

    # -- one layer ---------------------------------------------------------------------------
    def _sources(self, conv, work: LayerWork, prev_targets, prev_h, x_query, prep, meter):
        """cgp_kernel `sources`: inputs of edges `sel` per distinct source (OLD: stored values)."""
        l0 = work.layer - 1

        def sources(sel: np.ndarray, old: bool):
            uniq, inv = self.ctx.sets.unique_inverse(work.src[sel])
            if old:
                with meter.timer("fetch_s"):
                    vals = self.stored.value(l0, uniq, meter)
            else:
                vals = self._values(l0, uniq, prev_targets, prev_h, x_query, prep, meter)
            return vals, self._stats(conv, prep, uniq, old), inv

        return sources

    @torch.no_grad()
    def run_layer(self, work: LayerWork, prev_targets, prev_h, x_query, prep, meter: Meter, comm: dict):
        conv = self.model.convs[work.layer - 1]
        t = len(work.targets)
        l0 = work.layer - 1
        h_dst = self._values(l0, work.targets, prev_targets, prev_h, x_query, prep, meter)
        stats_new = self._stats(conv, prep, work.targets, old=False)
        with meter.timer("compute_s"):
            dst_new = conv.prepare_dst(h_dst, stats_new)
        dst_old = None
        if conv.needs_dst_in_message and work.old.any():
            g_t = work.targets
            with meter.timer("fetch_s"):
                dst_old = conv.prepare_dst(
                    self.stored.value(l0, np.where(g_t < self.ctx.num_nodes, g_t, 0), meter),
                    self._stats(conv, prep, np.where(g_t < self.ctx.num_nodes, g_t, 0), True),
                )

        def stored_states(rows):
            with meter.timer("fetch_s"):
                return self.stored.stored_state(work.layer, work.targets[rows], meter)

        sources = self._sources(conv, work, prev_targets, prev_h, x_query, prep, meter)
        src_owner = owner_of(self.ctx, prep, work.src, self.parts)
        tgt_owner = owner_of(self.ctx, prep, work.targets, self.parts)
        partials = [
            partition_partials(
                conv,
                p,
                edge_owner=src_owner,
                old=work.old,
                tgt=work.tgt,
                weight=work.weight,
                target_owner=tgt_owner,
                from_state=work.from_state,
                sources=sources,
                stored_states=stored_states,
                dst=(dst_new, dst_old),
                timer=meter.timer,
                unique_inverse=self.ctx.sets.unique_inverse,
            )
            for p in range(self.parts)
        ]
        with meter.timer("merge_s"):
            merged = merge_partials(
                conv, [s for r in partials for s in r.states], [i for r in partials for i in r.index], t
            )
        with meter.timer("compute_s"):
            h = self.model.post(l0, conv.update(h_dst, conv.aggregator.finalize(merged), stats_new, False))
        count_layer(comm, (r.partial_bytes for r in partials), h, self.parts)
        return h

    @torch.no_grad()
    def run_queries(self, prep: PreparedRequest, meter: Meter) -> tuple[list, np.ndarray, int]:
        """HE's layers on one partition: every layer's targets are the queries, whose in-edges are
        all NEW, with no stored state and nothing to exchange. The same arithmetic as `run` on
        plans.he_works (the same edges, source values, statistics, partial and merge), without
        building LayerWork, owners and per-partition selections: for a single-query request those
        were most of the answer's CPU. Returns (per-layer values of the queries, the distinct
        sources of every layer's edges, the number of edges)."""
        ctx, b = self.ctx, prep.batch_size
        sets = ctx.sets
        q = prep.query_union
        x_query = self.model.pre(torch.from_numpy(np.require(prep.request.x, np.float32, ["C", "W"])))
        h_q = x_query  # the queries' values one layer down (row i: query i)
        values, sources, edges = [], [], 0
        for l0, conv in enumerate(self.model.convs):
            src, tgt, w = edges_into(ctx, prep, q, conv.self_loops, ctx.edge_values(conv))
            uniq, inv = sets.unique_inverse(src)
            down, down_h = (q, h_q) if l0 else (None, None)
            vals = self._values(l0, uniq, down, down_h, x_query, prep, meter)
            stats_src = self._stats(conv, prep, uniq, old=False)
            stats_dst = self._stats(conv, prep, q, old=False)
            with meter.timer("compute_s"):
                dst = conv.prepare_dst(h_q, stats_dst)
                payload = conv.prepare_src(vals, stats_src, False)[torch.from_numpy(inv)]
                d = None if dst is None else dst[torch.from_numpy(tgt)]
                m = conv.message(payload, d, None if w is None else torch.from_numpy(w), False)
                reached, local = sets.unique_inverse(tgt)
                part = conv.aggregator.partial(m, torch.from_numpy(local), len(reached))
            with meter.timer("merge_s"):
                merged = merge_partials(conv, [part], [reached], b)
            with meter.timer("compute_s"):
                h_q = self.model.post(l0, conv.update(h_q, conv.aggregator.finalize(merged), stats_dst, False))
            values.append(h_q)
            sources.append(uniq)
            edges += len(src)
        return values, sets.unique(q, *sources), edges

    def run(self, works: list, prep: PreparedRequest, meter: Meter):
        """Evaluate works[0..k-1] (layer 1..k); returns (per-layer target values, comm bytes)."""
        x_query = self.model.pre(torch.from_numpy(np.require(prep.request.x, np.float32, ["C", "W"])))
        prev_targets, prev_h = None, None
        comm = no_exchange()
        values = []
        for work in works:
            h = self.run_layer(work, prev_targets, prev_h, x_query, prep, meter, comm)
            values.append(h)
            prev_targets, prev_h = work.targets, h
        return values, comm
