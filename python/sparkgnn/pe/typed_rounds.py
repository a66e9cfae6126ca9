"""The round machinery typed EXACT serving (serving/typed.py) and the typed PE refresh
(pe/typed_refresh.py) share: G's relations indexed by destination, the rows each round needs
from an answer's queries, the rows whose value a change moves, and a round's value of a node type
at given rows computed over all their in-edges of every relation, reading unchanged neighbours
from the typed PE store (pe/typed.py). It lives in pe, below serving, because the refresh needs it
and serving already builds on pe.

Rows are union rows: per node type, G's rows first, then the rows a request or an update adds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from sparkgnn import npsets
from sparkgnn.errors import UnsupportedModelError

if TYPE_CHECKING:
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.layers.hetero import EdgeType, HeteroRound
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.pe.typed import TypedPEStore


@dataclass
class UnionRows:
    """A checked request (or update) in the union graph's row space (per type: G's rows, then the queries')."""

    queries: dict[str, np.ndarray]  # type -> union rows of its queries, in request order
    x: dict[str, torch.Tensor]  # type -> the queries' input rows (before pre ops)
    edges: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]  # relation -> union rows


class TypedRounds:
    """Round-by-round values of a typed model on G plus added rows (module doc). `store`: the
    typed PE store whose values stand for every row a change did not move (None: nothing is
    read from a store, every needed row is computed)."""

    def __init__(self, graph: TypedGraphData, model: HeteroModel, store: TypedPEStore | None = None):
        self.graph, self.model, self.store = graph, model, store
        self.rounds: list[HeteroRound] = model.round_list()
        # per relation: G's edges sorted by destination row (the in-edges of a row are a slice)
        self._csc: dict[EdgeType, tuple[np.ndarray, np.ndarray]] = {}
        for et in graph.edge_types:
            src, dst = graph.edge_index(et)
            order = np.argsort(dst, kind="stable")
            self._csc[et] = (src[order], dst[order])
        self._sizes = {t: n.num_nodes for t, n in graph.nodes.items()}

    def _in_edges(self, et: EdgeType, rows: np.ndarray, prep: UnionRows) -> tuple[np.ndarray, np.ndarray]:
        """(src rows, dst rows) of every in-edge of `rows` (sorted union rows) in relation `et`:
        G's edges and the request's."""
        src, dst = self._csc[et]
        lo, hi = np.searchsorted(dst, rows, "left"), np.searchsorted(dst, rows, "right")
        take = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)] or [np.empty(0, np.int64)])
        take = take.astype(np.int64)
        s, d = src[take], dst[take]
        if et in prep.edges:
            rs, rd = prep.edges[et]
            keep = np.isin(rd, rows)
            s, d = np.concatenate([s, rs[keep]]), np.concatenate([d, rd[keep]])
        return s.astype(np.int64), d.astype(np.int64)

    def _needed(self, prep: UnionRows) -> list[dict[str, np.ndarray]]:
        """Per round 0..k, the rows of each type whose value the answer needs (module doc)."""
        k = len(self.rounds)
        need: list[dict[str, np.ndarray]] = [{} for _ in range(k + 1)]
        need[k] = {t: rows for t, rows in prep.queries.items() if t in self.model.outputs and len(rows)}
        for l in range(k, 0, -1):
            rnd = self.rounds[l - 1]
            below: dict[str, list[np.ndarray]] = {}
            for t, rows in need[l].items():
                if t in rnd.keep or t in rnd.dst_types:
                    below.setdefault(t, []).append(rows)
                for et in rnd.edge_types:
                    if et[2] == t:
                        below.setdefault(et[0], []).append(self._in_edges(et, rows, prep)[0])
            need[l - 1] = {t: npsets.unique(np.concatenate(parts)) for t, parts in below.items()}
        return need

    def _affected(self, prep: UnionRows, need: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Per round, the needed rows whose value differs from the store's (module doc)."""
        k = len(self.rounds)
        changed: list[dict[str, np.ndarray]] = [{} for _ in range(k + 1)]
        changed[0] = {t: rows[rows >= self._sizes[t]] for t, rows in need[0].items()}
        for l in range(1, k + 1):
            rnd = self.rounds[l - 1]
            for t, rows in need[l].items():
                hit = rows >= self._sizes[t]  # the queries
                if t in rnd.keep or t in rnd.dst_types:
                    hit |= np.isin(rows, changed[l - 1].get(t, ()))
                for et in rnd.edge_types:
                    if et[2] != t:
                        continue
                    s, d = self._in_edges(et, rows, prep)
                    moved = np.isin(s, changed[l - 1].get(et[0], ())) | (s >= self._sizes[et[0]])
                    if et in prep.edges:  # request edges: their G endpoint's value changes
                        hit |= np.isin(rows, prep.edges[et][1])
                    hit |= np.isin(rows, d[moved])
                changed[l][t] = rows[hit]
        return changed

    def _inputs(self, prep: UnionRows, node_type: str, rows: np.ndarray) -> torch.Tensor:
        """h^(0) at union rows: G's features (pe.typed.input_rows) and the queries', through pre ops."""
        from sparkgnn.layers.nodeops import NodeOpStack
        from sparkgnn.pe.typed import input_rows

        n = self._sizes[node_type]
        g_rows, q_rows = rows[rows < n], rows[rows >= n]
        parts = []
        if len(g_rows):
            parts.append(input_rows(self.graph, self.model, node_type, g_rows))
        if len(q_rows):
            x = prep.x[node_type][q_rows - n]
            pre = self.model.pre_ops
            parts.append(cast(NodeOpStack, pre[node_type])(x) if node_type in pre else x)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _value(self, l: int, node_type: str, rows: np.ndarray, prep, computed, changed, meter) -> torch.Tensor:
        """h^(l) of `node_type` at sorted union `rows`: computed where this request changed it,
        else G's value (round 0: features; later: the store's)."""
        out: torch.Tensor | None = None
        have = changed[l].get(node_type, np.empty(0, np.int64))
        fresh = np.isin(rows, have)
        if fresh.any():
            mine, h = computed[node_type]
            picked = h[np.searchsorted(mine, rows[fresh])]
            out = torch.empty(len(rows), picked.shape[1])
            out[torch.from_numpy(fresh)] = picked
        stale = rows[~fresh]
        if len(stale):
            if l == 0:
                old = self._inputs(prep, node_type, stale)
            else:
                started = time.perf_counter()
                ids = self.graph.nodes[node_type].ids[stale]
                old = torch.from_numpy(cast("TypedPEStore", self.store).lookup(node_type, ids, l))
                meter["fetch_s"] += time.perf_counter() - started
            if out is None:
                return old
            out[torch.from_numpy(~fresh)] = old
        assert out is not None
        return out

    def run_rounds(
        self, prep: UnionRows, changed: list[dict[str, np.ndarray]], meter: dict[str, float]
    ) -> dict[str, tuple[np.ndarray, torch.Tensor]]:
        """Rounds 1..k computed at the rows `changed[l]` names per round (sorted union rows;
        changed[0]: the inputs read), every other row read from G (round 0) or the store; returns
        round k's (rows, h) per type. `meter`: fetch_s and nodes_recomputed are added to it."""
        values: dict[str, tuple[np.ndarray, torch.Tensor]] = {
            t: (rows, self._inputs(prep, t, rows)) for t, rows in changed[0].items() if len(rows)
        }
        for l, rnd in enumerate(self.rounds, start=1):
            previous = values
            values = {}
            for t, rows in changed[l].items():
                if len(rows):
                    values[t] = (rows, self._round(rnd, l, t, rows, prep, previous, changed, meter))
                    meter["nodes_recomputed"] += float((rows < self._sizes[t]).sum())
        return values

    def _round(self, rnd, l: int, t: str, rows: np.ndarray, prep, computed, changed, meter) -> torch.Tensor:
        """Round l's value of type `t` at sorted union `rows` (HeteroRound.forward on those rows)."""
        from sparkgnn.layers.base import propagate
        from sparkgnn.layers.nodeops import NodeOpStack

        def value(node_type: str, at: np.ndarray) -> torch.Tensor:
            return self._value(l - 1, node_type, at, prep, computed, changed, meter)

        outs = []
        for et, conv in rnd.conv_items():
            s, _, d = et
            if d != t:
                continue
            src, dst = self._in_edges(et, rows, prep)
            if s == d:
                nodes = npsets.union(rows, src)
                h = propagate(
                    conv, value(t, nodes), torch.from_numpy(np.searchsorted(nodes, src)),
                    torch.from_numpy(np.searchsorted(nodes, dst)), pre_transform=False,
                )  # fmt: skip
                outs.append(h[torch.from_numpy(np.searchsorted(nodes, rows))])
            else:
                sources = npsets.unique(src)
                hs = value(s, sources) if len(sources) else torch.zeros(0, conv.in_dim)
                outs.append(
                    propagate(
                        conv,
                        hs,
                        torch.from_numpy(np.searchsorted(sources, src)),
                        torch.from_numpy(np.searchsorted(rows, dst)),
                        pre_transform=False,
                        h_dst=value(t, rows),
                    )  # fmt: skip
                )
        if outs:
            h = rnd.relation_aggr.combine(outs)
        else:
            h = cast(NodeOpStack, rnd.keep[t])(value(t, rows))
        if t in rnd.post:
            h = cast(NodeOpStack, rnd.post[t])(h)
        return h


def check_local_rounds(model: HeteroModel, job: str, remedy: str) -> None:
    """Refuse (UnsupportedModelError, one line naming `job`, the round and the relation) a relation
    that recomputing a vertex from its in-edges cannot run exactly: a conv that needs node
    statistics over the whole relation (a k-hop neighbourhood lacks its frontier's), or one that
    takes several passes over the edges (its neighbourhood is deeper than one round). `remedy`
    ends the message (what to do instead)."""
    from sparkgnn.layers.phases import expand_passes

    for index, rnd in enumerate(model.round_list()):
        for et, conv in rnd.conv_items():
            where = f"{job}: round {index + 1}, relation {et} ({conv.kind})"
            if conv.required_stats:
                raise UnsupportedModelError(
                    f"{where} needs node statistics {list(conv.required_stats)} over the whole relation; {remedy}"
                )
            if len(expand_passes(conv)) != 1:
                raise UnsupportedModelError(f"{where} takes several passes over the edges; {remedy}")
