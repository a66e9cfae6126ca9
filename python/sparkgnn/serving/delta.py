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
edge is aggregated by its SOURCE's partition from that partition's own stored rows only (checked),
each partition's partial states go to the target's owner (counted as exchanged bytes), owners
merge them with the stored state they hold and apply update, and the new values are all-gathered
(counted) for the next layer. Because merge is associative and commutative the answer equals
P = 1 up to float summation order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from sparkgnn.layers.selfloops import apply_self_loops
from sparkgnn.serving.context import Meter, PreparedRequest, ServingContext


@dataclass
class LayerWork:
    layer: int                 # 1..k
    targets: np.ndarray        # union indices, queries first
    from_state: np.ndarray     # bool [T]
    src: np.ndarray            # union index of each edge's source
    tgt: np.ndarray            # position in `targets` of each edge's destination
    weight: Optional[np.ndarray]
    old: np.ndarray            # bool [E]: message from stored values, subtracted

    @property
    def num_new(self) -> int:
        return int((~self.old).sum())


def edges_into(ctx: ServingContext, prep: PreparedRequest, targets: np.ndarray, policy: str):
    """All in-edges of the union vertices `targets` (G's in-edges + request edges), with the
    conv's self-loop policy applied exactly as on the whole union graph: policies only add or
    drop loops of the destinations, and a destination's loops are among its in-edges. Returns
    (src union index, target position, weight or None)."""
    t = len(targets)
    sets = ctx.sets
    src, dst, w = ctx.in_edges(prep, targets)
    tgt = sets.positions(targets, dst)
    if policy == "none":
        return src, tgt, w
    # local numbering for the policy: targets 0..T-1, other sources T.. (never looped)
    local = sets.positions(targets, src)
    is_t = local >= 0
    others, other_pos = sets.unique_inverse(src[~is_t])
    local[~is_t] = t + other_pos
    s, d, w2 = apply_self_loops(torch.from_numpy(local), torch.from_numpy(tgt),
                                None if w is None else torch.from_numpy(w), t, policy)
    s = s.numpy()
    back = np.concatenate([targets, others])
    return back[s], d.numpy(), None if w2 is None else w2.numpy()


def owner_of(ctx: ServingContext, prep: PreparedRequest, union: np.ndarray, parts: int) -> np.ndarray:
    """Partition of each union vertex: G vertex -> original id mod P, query i -> i mod P."""
    if parts == 1:
        return np.zeros(len(union), np.int64)
    n = ctx.num_nodes
    out = np.empty(len(union), np.int64)
    g = union < n
    out[g] = np.mod(ctx.graph.ids[union[g]], parts)
    out[~g] = np.mod(union[~g] - n, parts)
    return out


class LayerExecutor:
    """Evaluates a list of LayerWork bottom-up (module doc). `stored` is a StoredLayers."""

    def __init__(self, ctx: ServingContext, model, stored, parts: int = 1):
        self.ctx, self.model, self.stored, self.parts = ctx, model, stored, max(1, int(parts))

    # -- values ------------------------------------------------------------------------------
    def _values(self, layer_prev: int, nodes: np.ndarray, prev_targets, prev_h, x_query,
                prep, meter: Meter) -> torch.Tensor:
        """Current value at layer `layer_prev` of union vertices `nodes` (see module doc)."""
        n = self.ctx.num_nodes
        pos = None
        if prev_targets is not None and len(prev_targets):
            pos = self.ctx.sets.positions(prev_targets, nodes)
            hit = pos >= 0
        else:
            hit = np.zeros(len(nodes), bool)
        is_q = nodes >= n
        width = (prev_h.shape[1] if prev_h is not None else x_query.shape[1])
        out = torch.empty(len(nodes), width, dtype=torch.float32)
        if hit.any():
            out[torch.from_numpy(hit)] = prev_h[torch.from_numpy(pos[hit])]
        q_only = is_q & ~hit
        if q_only.any():
            if layer_prev != 0:
                raise AssertionError("a query's value must come from the previous layer's targets")
            out[torch.from_numpy(q_only)] = x_query[torch.from_numpy(nodes[q_only] - n)]
        rest = ~hit & ~is_q
        if rest.any():
            with meter.timer("fetch_s"):
                out[torch.from_numpy(rest)] = self.stored.value(layer_prev, nodes[rest], meter)
        return out

    def _stats(self, conv, prep, nodes: np.ndarray, old: bool) -> dict:
        if not conv.required_stats:
            return {}
        if old:
            rows = torch.from_numpy(nodes)
            return {name: self.ctx.g_stat(name, conv.uses_edge_weight)[rows].to(torch.float32)
                    for name in conv.required_stats}
        return self.ctx.union_stats(conv, prep, nodes)

    # -- one layer ---------------------------------------------------------------------------
    def _messages(self, conv, work: LayerWork, sel: np.ndarray, old: bool, dst_payload,
                  prev_targets, prev_h, x_query, prep, meter):
        """Messages of the edges `sel` (all NEW or all OLD)."""
        src = work.src[sel]
        uniq, inv = self.ctx.sets.unique_inverse(src)
        l0 = work.layer - 1
        if old:
            with meter.timer("fetch_s"):
                vals = self.stored.value(l0, uniq, meter)
        else:
            vals = self._values(l0, uniq, prev_targets, prev_h, x_query, prep, meter)
        stats = self._stats(conv, prep, uniq, old)
        with meter.timer("compute_s"):
            payload = conv.prepare_src(vals, stats, False)
            w = None if work.weight is None else torch.from_numpy(work.weight[sel])
            d = None if dst_payload is None else dst_payload[torch.from_numpy(work.tgt[sel])]
            return conv.message(payload[torch.from_numpy(inv)], d, w, False)

    @torch.no_grad()
    def run_layer(self, work: LayerWork, prev_targets, prev_h, x_query, prep, meter: Meter,
                  comm: dict):
        conv = self.model.convs[work.layer - 1]
        agg = conv.aggregator
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
                dst_old = conv.prepare_dst(self.stored.value(l0, np.where(g_t < self.ctx.num_nodes, g_t, 0), meter),
                                           self._stats(conv, prep, np.where(g_t < self.ctx.num_nodes, g_t, 0), True))
        src_owner = owner_of(self.ctx, prep, work.src, self.parts)
        tgt_owner = owner_of(self.ctx, prep, work.targets, self.parts)
        states, index = [], []
        msg_w = conv.msg_width(False)
        for p in range(self.parts):
            mine = src_owner == p
            for old in (False, True):
                sel = np.flatnonzero(mine & (work.old == old))
                if not len(sel):
                    continue
                m = self._messages(conv, work, sel, old, dst_old if old else dst_new,   # times itself
                                   prev_targets, prev_h, x_query, prep, meter)
                with meter.timer("compute_s"):
                    uniq, local = self.ctx.sets.unique_inverse(work.tgt[sel])
                    part = agg.partial(m, torch.from_numpy(local), len(uniq))
                    if old:
                        part = agg.negate(part)
                states.append(part)
                index.append(uniq)
                if self.parts > 1:       # partial rows shipped to another partition's owner
                    comm["partial_bytes"] += int(part.shape[1] * 4 * (tgt_owner[uniq] != p).sum())
        stored_rows = np.flatnonzero(work.from_state)
        if len(stored_rows):
            with meter.timer("fetch_s"):
                states.append(self.stored.stored_state(work.layer, work.targets[stored_rows], meter))
            index.append(stored_rows)
        with meter.timer("merge_s"):
            if states:
                merged = agg.merge(torch.cat(states), torch.from_numpy(np.concatenate(index)), t)
            else:
                merged = agg.identity(t, msg_w)
        with meter.timer("compute_s"):
            h = self.model.post(l0, conv.update(h_dst, agg.finalize(merged), stats_new, False))
        if self.parts > 1:                # all-gather of the new values for the next layer
            comm["allgather_bytes"] += int(h.shape[0] * h.shape[1] * 4 * (self.parts - 1))
        return h

    def run(self, works: list, prep: PreparedRequest, meter: Meter):
        """Evaluate works[0..k-1] (layer 1..k); returns (per-layer target values, comm bytes)."""
        x_query = self.model.pre(torch.from_numpy(np.require(prep.request.x, np.float32, ["C", "W"])))
        prev_targets, prev_h = None, None
        comm = {"partial_bytes": 0, "allgather_bytes": 0}
        values = []
        for work in works:
            h = self.run_layer(work, prev_targets, prev_h, x_query, prep, meter, comm)
            values.append(h)
            prev_targets, prev_h = work.targets, h
        return values, comm
