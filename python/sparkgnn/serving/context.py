"""ServingContext: what every serving mode shares about G, built once per engine.

WHY: a request touches a few thousand vertices of a graph that may have millions, so the
per-request work must be proportional to the computation graph, not to G. The context therefore
builds, once, G's in-edge (CSC) index (vectorised numpy: one stable argsort of the edge
destinations), keeps G's per-node layer statistics (GCN degrees) for every conv the model has,
and is the ONLY door to G's stored features, so the bytes a request reads are counted
(`Meter.bytes_fetched`, the quantity of OMEGA Fig. 11).

Union indexing: for one request, vertices of G keep their dense index 0..N-1 and query i gets
N + i. Request edges carry no weight: where G is weighted they count with weight 1.0.

Edge attributes: for a model whose layers read them (GINEConv, GAT & co. with edge_dim) the
per-edge value every edge list carries (`in_edges`' third array, CompGraph.weight,
LayerWork.weight) is the edge's attribute row ([E, D]: G's `edge_attr`, a request edge's own
`edge_attr`) instead of its weight, as the layers read it (layers/base.py); `edge_values(conv)`
says whether a conv reads that slot. Such a model next to a layer that reads G's weights is
refused (one slot per edge).

Threads: one context is shared by every call answering on it at once (an online pool's slots and
express lanes, serving.online.dispatch). What it builds lazily (the out-index, G's statistics,
the aligned stores, `cached` objects) is built once under its lock and only read afterwards; the
set-operation scratch marks (`sets`, nodesets.py), which every operation writes, are per thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.base import compute_stats
from sparkgnn.layers.stats import OUT_EDGE_STATS, STATS
from sparkgnn.serving.nodesets import NodeSets
from sparkgnn.serving.request import Request, RequestError

# Statistics that are sums over a node's in-edges (or, OUT_EDGE_STATS, its out-edges) of (weight
# or 1), with self loops handled inside the statistic. Request edges are never self loops on a
# vertex of G (every request edge touches a query), so for a vertex of G: stat(G + request) =
# stat(G) + (number of request in-edges, or out-edges), request edges having weight 1. A stat not
# listed here cannot be served exactly.
ADDITIVE_STATS = ("in_degree", "weighted_in_degree", "gcn_degree", *sorted(OUT_EDGE_STATS))


@dataclass
class Meter:
    """Per-request cost counters; `timer(key)` adds wall seconds to `seconds[key]`."""

    seconds: dict = field(default_factory=lambda: {"plan_s": 0.0, "fetch_s": 0.0, "compute_s": 0.0, "merge_s": 0.0})
    bytes_fetched: int = 0

    def timer(self, key: str) -> _Timed:
        """A context manager adding its block's wall seconds to `seconds[key]` (a small class, not
        a generator: a request's layers enter a few dozen of these, and contextlib's generator
        machinery is a visible share of a single-query answer)."""
        return _Timed(self.seconds, key)


class _Timed:
    __slots__ = ("seconds", "key", "t0")

    def __init__(self, seconds: dict, key: str):
        self.seconds, self.key = seconds, key

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.seconds[self.key] = self.seconds.get(self.key, 0.0) + time.perf_counter() - self.t0


@dataclass
class PreparedRequest:
    """A validated request in union indices (see module doc)."""

    request: Request
    num_g: int  # N, the number of vertices of G
    src: np.ndarray  # union index of each request edge's source
    dst: np.ndarray  # union index of each request edge's destination
    # each request edge's attribute row [E, D] when the model reads edge attributes, else None
    edge_attr: np.ndarray | None = None

    @property
    def batch_size(self) -> int:
        return self.request.batch_size

    @property
    def query_union(self) -> np.ndarray:
        return self.num_g + np.arange(self.batch_size, dtype=np.int64)


def raise_unknown_ids(request: Request, ids: np.ndarray) -> None:
    """Refuse a request whose edges name ids that are neither its queries nor vertices of G
    (count + first examples): mapping them to some union index would answer another graph."""
    from sparkgnn.graph.problems import MAX_EXAMPLES

    _, first = np.unique(ids, return_index=True)
    distinct = ids[np.sort(first)]
    shown = ", ".join(str(int(v)) for v in distinct[:MAX_EXAMPLES])
    raise RequestError(
        f"request {request.request_id!r}: {len(distinct)} edge endpoint ids are neither a "
        f"query nor a vertex of the graph; first: {shown}"
        f"{', ...' if len(distinct) > MAX_EXAMPLES else ''}"
    )


def range_gather(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of all CSR entries of `rows` (concatenated in row order) and each row's count,
    without a Python loop: repeat each row's start, add a running offset."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), counts
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return offsets + np.arange(total, dtype=np.int64), counts


def _appended_edges(previous: ServingContext, graph) -> int | None:
    """How many edges `graph` appends to `previous`'s graph when that is all that differs in its
    structure -- the same vertices in the same rows, every earlier edge (and weight) in place,
    the new ones after them, as graph.updates.apply lays out an update without vertex changes or
    edge deletes -- else None (the index is then built from scratch)."""
    old = previous.graph
    e = old.num_edges
    if old.num_nodes != graph.num_nodes or graph.num_edges < e or not np.array_equal(old.ids, graph.ids):
        return None
    if (old.weight is None) != (graph.weight is None) or getattr(graph, "edge_attr", None) is not None:
        return None
    if not (np.array_equal(old.edge_dst, graph.edge_dst[:e]) and np.array_equal(old.edge_src, graph.edge_src[:e])):
        return None
    if old.weight is not None and not np.array_equal(old.weight, graph.weight[:e]):
        return None
    return graph.num_edges - e


def _inserted_csr(indptr, values, weight, graph, appended: int, key: np.ndarray, other: np.ndarray):
    """(indptr, values, weight) of the index grouping `graph`'s edges by `key` (edge_dst: the
    CSC in-index, edge_src: the out-index), from the index over all but its last `appended`
    edges: each appended edge goes after its group's existing entries, the appended ones in
    edge order -- what a stable argsort of the whole key column gives."""
    e = graph.num_edges - appended
    order = np.argsort(key[e:], kind="stable")
    groups = key[e:][order]
    at = indptr[groups + 1]
    grown = np.array(indptr, copy=True)
    grown[1:] += np.cumsum(np.bincount(groups, minlength=len(indptr) - 1))
    new_values = np.insert(values, at, other[e:][order])
    new_weight = None if weight is None else np.insert(weight, at, graph.weight[e:][order])
    return grown, new_values, new_weight


class ServingContext:
    """G (a GraphData), the model, G's CSC index and G's layer statistics. `store` is reserved
    for the PE store of the modes that reuse embeddings (HE, SRPE, EXACT); FULL and NS ignore it.
    `previous`: the context of an earlier version of G (a delta swap, serving.online.delta); when
    G only appends edges to that version's graph, its CSC (and out-) index is patched from that
    context's instead of sorted again (the same arrays either way)."""

    def __init__(self, graph, model, store=None, validate: bool = True, *, previous: ServingContext | None = None):
        self.graph = graph
        self.model = model
        self.store = store
        self.validate = bool(validate)
        n = graph.num_nodes
        self.attr_dim = int(getattr(model, "edge_attr_dim", 0) or 0) if model is not None else 0
        grown = _appended_edges(previous, graph) if previous is not None and not self.attr_dim else None
        self._out: tuple[np.ndarray, np.ndarray] | None = None
        self.indptr: np.ndarray
        self.in_src: np.ndarray
        self.in_weight: np.ndarray | None
        if previous is not None and grown is not None:  # `previous`'s index with the appended edges inserted
            self.indptr, self.in_src, self.in_weight = _inserted_csr(
                previous.indptr, previous.in_src, previous.in_weight, graph, grown, graph.edge_dst, graph.edge_src
            )
            if previous._out is not None:
                out_indptr, out_dst = previous._out
                out_indptr, out_dst, _ = _inserted_csr(
                    out_indptr, out_dst, None, graph, grown, graph.edge_src, graph.edge_dst
                )
                self._out = (out_indptr, out_dst)
        else:
            order = np.argsort(graph.edge_dst, kind="stable")  # stable: a node's in-edges keep G's order
            self.indptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(graph.edge_dst, minlength=n), out=self.indptr[1:])
            self.in_src = np.ascontiguousarray(graph.edge_src[order])
            self.in_weight = None if graph.weight is None else np.ascontiguousarray(graph.weight[order])
        # G's edge attributes in CSC order when the model reads them (module doc), else None
        self.in_attr: np.ndarray | None = None
        if self.attr_dim:
            self.in_attr = np.ascontiguousarray(edge_attr_of(graph, model)[order])
        elif model is not None and hasattr(model, "check_edge_attr"):  # a layer unsure it reads G's (pyg_convs._gen)
            model.check_edge_attr(
                int(getattr(graph, "edge_attr_dim", 0) or 0) or None, where=f"graph {getattr(graph, 'name', 'G')!r}"
            )
        self._g_stats: dict = {}
        self._aligned: dict = {}
        self._cache: dict = {}
        self._lock = threading.RLock()  # the lazy builds above (module doc); reentrant: a build may use another
        self._sets_size = n + 1024  # the marks every thread's NodeSets holds: N + the largest batch seen
        self._local = threading.local()

    @property
    def sets(self) -> NodeSets:
        """The calling thread's reusable marks over union indices (nodesets.py): each operation
        writes them and cleans them before it returns, so two threads never share one."""
        try:
            sets = self._local.sets
        except AttributeError:
            sets = self._local.sets = NodeSets(self._sets_size)
        sets.ensure(self._sets_size)  # a batch another thread prepared may have grown the size
        return sets

    def __getstate__(self) -> dict:
        # a context travels with a partitioned executor (spark_cgp): locks and per-thread marks do not
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_local")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._local = threading.local()

    def out_neighbors(self, rows: np.ndarray) -> np.ndarray:
        """Distinct G out-neighbours of G vertices `rows` (the out-index is built on first use:
        only the modes that track which stored values a request changes need it)."""
        if self._out is None:
            with self._lock:
                if self._out is None:
                    g = self.graph
                    order = np.argsort(g.edge_src, kind="stable")
                    indptr = np.zeros(g.num_nodes + 1, np.int64)
                    np.cumsum(np.bincount(g.edge_src, minlength=g.num_nodes), out=indptr[1:])
                    self._out = (indptr, np.ascontiguousarray(g.edge_dst[order]))
        indptr, out_dst = self._out
        pos, _ = range_gather(indptr, np.asarray(rows, np.int64))
        return self.sets.unique(out_dst[pos])

    def cached(self, key: str, build):
        """`build()` once per context under `key` (per-graph statistics other modules derive,
        e.g. serving/sketch.py's GraphSketch), then the same object."""
        found = self._cache.get(key)
        if found is None:
            with self._lock:
                found = self._cache.get(key)
                if found is None:
                    found = self._cache[key] = build()
        return found

    def g_in_degree(self) -> np.ndarray:
        """Number of in-edges of each G vertex (from the CSC index)."""
        return np.diff(self.indptr)

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def weighted(self) -> bool:
        return self.in_weight is not None

    @property
    def carries_edge_values(self) -> bool:
        """Whether edge lists carry a per-edge value (G's weights or, module doc, attributes)."""
        return self.in_attr is not None or self.in_weight is not None

    def edge_values(self, conv) -> bool:
        """Whether `conv` reads the per-edge value slot of this context's edge lists."""
        if self.in_attr is not None:
            return bool(conv.edge_attr_dim)
        return self.in_weight is not None

    def request_edge_values(self, prep: PreparedRequest, sel: np.ndarray) -> np.ndarray | None:
        """The per-edge values of the request edges `sel` (bool mask or positions): their
        attribute rows, weight 1.0 each on a weighted G, or None."""
        if self.in_attr is not None:
            assert prep.edge_attr is not None  # prepare() refuses a request without them
            return prep.edge_attr[sel]
        if self.in_weight is None:
            return None
        return np.ones(int(sel.sum()) if sel.dtype == bool else len(sel), np.float32)

    # -- storage ----------------------------------------------------------------------------
    def fetch_features(self, rows: np.ndarray, meter: Meter) -> np.ndarray:
        """Raw features of G's vertices `rows` (dense indices), counted into the meter."""
        out = self.graph.x[rows]
        meter.bytes_fetched += int(out.nbytes)
        return out

    def stored_layers(self, store, model, states: bool):
        """The store aligned to G (stored.py), built once per (store, model) and shared by every
        engine on this context: aligning costs ~N x (embedding + state) bytes and a search."""
        from sparkgnn.serving.stored import StoredLayers

        key = (store.base, model.fingerprint(), bool(states))
        with_states = (store.base, model.fingerprint(), True)
        with self._lock:
            if key not in self._aligned and with_states in self._aligned:
                return self._aligned[with_states]  # a copy with states serves HE too
            if key not in self._aligned:
                self._aligned[key] = StoredLayers(store, self.graph, model, states=states)
            return self._aligned[key]

    def aligned_layers(self) -> dict:
        """The aligned stores built so far, keyed (store base, model fingerprint, with states)."""
        with self._lock:
            return dict(self._aligned)

    def adopt_stored_layers(self, store, model, states: bool, layers) -> None:
        """Use `layers` (a StoredLayers over this context's G) as `store`'s aligned copy, so no
        engine aligns it again: a delta swap hands over arrays it patched (serving.online.delta)."""
        if layers.graph is not self.graph:
            raise ValueError("adopt_stored_layers: the aligned layers belong to another graph than this context's")
        with self._lock:
            self._aligned[(store.base, model.fingerprint(), bool(states))] = layers

    # -- requests ---------------------------------------------------------------------------
    def prepare(self, request: Request) -> PreparedRequest:
        """Validate (unless disabled) and map the request's edges to union indices."""
        if self.validate:
            request.validate(self.graph)
        n = self.num_nodes
        needed = n + request.batch_size + 1
        if needed > self._sets_size:  # new threads' marks start this large (a lost race: a later ensure)
            self._sets_size = needed
        self.sets.ensure(needed)
        order = np.argsort(request.qid, kind="stable")
        sorted_q = request.qid[order]

        def to_union(ids):
            out, in_g = self.graph.id_index.lookup(ids)
            if not in_g.all():
                q = ~in_g
                pos = np.minimum(np.searchsorted(sorted_q, ids[q]), max(len(sorted_q) - 1, 0))
                found = sorted_q[pos] == ids[q] if len(sorted_q) else np.zeros(int(q.sum()), bool)
                if not found.all():  # reachable with validate=False: never map them anywhere
                    raise_unknown_ids(request, ids[q][~found])
                out[q] = n + order[pos]
            return out

        attr = None
        if self.in_attr is not None:
            attr = request.edge_attr
            if attr is None:
                attr = np.zeros((0, self.attr_dim), np.float32) if not request.num_edges else None
            if attr is None or attr.ndim != 2 or attr.shape != (request.num_edges, self.attr_dim):
                have = "none" if request.edge_attr is None else f"shape {tuple(request.edge_attr.shape)}"
                raise RequestError(
                    f"request {request.request_id!r}: the model's layers read edge attributes of width "
                    f"{self.attr_dim}, the request's edges carry {have} (give edge_attr, one row per edge)"
                )
        return PreparedRequest(request, n, to_union(request.src), to_union(request.dst), attr)

    def in_edges(self, prep: PreparedRequest, frontier: np.ndarray):
        """All in-edges (src, dst, weight-or-None) of the union vertices `frontier`: G's in-edges
        of the frontier's G vertices (CSC order), then the request edges into the frontier."""
        n = self.num_nodes
        g_rows = frontier[frontier < n]
        pos, counts = range_gather(self.indptr, g_rows)
        sel = self.sets.member(prep.dst, frontier)
        src = np.concatenate([self.in_src[pos], prep.src[sel]])
        dst = np.concatenate([np.repeat(g_rows, counts), prep.dst[sel]])
        g_values = self.in_attr if self.in_attr is not None else self.in_weight
        if g_values is None:
            return src, dst, None
        request_values = self.request_edge_values(prep, sel)
        assert request_values is not None  # G carries values, so do the request's edges
        return src, dst, np.concatenate([g_values[pos], request_values])

    # -- layer statistics -------------------------------------------------------------------
    def g_stat(self, name: str, use_weight: bool) -> torch.Tensor:
        """A per-node statistic of G (computed once, cached), e.g. GCN's degree."""
        key = (name, bool(use_weight and self.weighted))
        found = self._g_stats.get(key)
        if found is None:
            with self._lock:
                found = self._g_stats.get(key)
                if found is None:
                    g = self.graph

                    def tensor(a):
                        return torch.from_numpy(np.require(a, requirements="W"))  # Arrow arrays are read-only

                    w = tensor(g.weight) if key[1] else None
                    found = self._g_stats[key] = STATS[name](tensor(g.edge_src), tensor(g.edge_dst), w, g.num_nodes)
        return found

    def request_stat_changes(self, conv, prep: PreparedRequest) -> np.ndarray:
        """Sorted G vertices whose statistics of `conv` the request changes: those with request
        in-edges, and for a statistic over OUT-edges (ChebConv's degree) those with request
        out-edges; empty for a conv without statistics."""
        n, parts = self.num_nodes, []
        for name in conv.required_stats:
            ends = prep.src if name in OUT_EDGE_STATS else prep.dst
            parts.append(ends[ends < n])
        return self.sets.unique(*parts) if parts else np.empty(0, np.int64)

    def union_stats(self, conv, prep: PreparedRequest, nodes: np.ndarray) -> dict:
        """conv's statistics for the union vertices `nodes`, as on the WHOLE union graph G + Q +
        request edges (not on a computation subgraph, whose boundary vertices lack in-edges)."""
        if not conv.required_stats:
            return {}
        unknown = [s for s in conv.required_stats if s not in ADDITIVE_STATS]
        if unknown:
            raise UnsupportedModelError(
                f"{conv.kind}: statistic(s) {unknown} cannot be updated for a request; supported: {ADDITIVE_STATS}"
            )
        n, b = self.num_nodes, prep.batch_size
        is_g = nodes < n
        g_rows = nodes[is_g]
        g_unique, g_inv = self.sets.unique_inverse(g_rows)
        q_pos = nodes[~is_g] - n
        by_direction = {}
        # (G end, query end) of the request edges as an in-edge statistic sees them (into the
        # vertex: dst), and as an out-edge one does (src and dst swapped)
        for out_edges in sorted({name in OUT_EDGE_STATS for name in conv.required_stats}):
            near, far = (prep.src, prep.dst) if out_edges else (prep.dst, prep.src)
            # request edge counts of G vertices at this end (weight 1 each)
            pos = self.sets.positions(g_unique, near[near < n])
            delta = np.bincount(pos[pos >= 0], minlength=len(g_unique)).astype(np.float32)[g_inv]
            # queries: all their edges at this end are request edges; other ends that are not
            # queries map to a dummy row b, so the statistic sees them as ordinary (non-loop) edges
            at_q = near >= n
            q_near = torch.from_numpy(near[at_q] - n)
            q_far = torch.from_numpy(np.where(far[at_q] >= n, far[at_q] - n, b))
            edges = (q_near, q_far) if out_edges else (q_far, q_near)  # (src, dst) for STATS
            by_direction[out_edges] = (delta, edges)
        out = {}
        for name in conv.required_stats:
            delta, (q_src, q_dst) = by_direction[name in OUT_EDGE_STATS]
            g_part = self.g_stat(name, conv.uses_edge_weight)[torch.from_numpy(g_rows)] + torch.from_numpy(delta)
            q_part = STATS[name](q_src, q_dst, None, b + 1)[torch.from_numpy(q_pos)]
            full = torch.empty(len(nodes), dtype=torch.float32)
            full[torch.from_numpy(is_g)] = g_part.to(torch.float32)
            full[torch.from_numpy(~is_g)] = q_part.to(torch.float32)
            out[name] = full
        return out


def edge_attr_of(graph, model) -> np.ndarray:
    """G's edge attributes for a `model` whose layers read them: refused (one line) when G has none
    or of another width (Model.check_edge_attr), or when a layer reads G's edge weights too (edge
    lists carry one value per edge, module doc)."""
    width = int(getattr(graph, "edge_attr_dim", 0) or 0)
    model.check_edge_attr(width or None, where=f"graph {getattr(graph, 'name', 'G')!r}")
    weighted = [c.kind for c in model.conv_list() if c.uses_edge_weight and not c.edge_attr_dim]
    if weighted and graph.weight is not None:
        raise UnsupportedModelError(
            f"serving carries one value per edge: the model's layers read edge attributes and its "
            f"{', '.join(sorted(set(weighted)))} layers G's edge weights; serve a graph without weights"
        )
    return graph.edge_attr


def subgraph_stats(conv, src: np.ndarray, dst: np.ndarray, weight, num_nodes: int) -> dict:
    """conv's statistics computed on a computation subgraph alone (what a sampled-subgraph
    pipeline such as PyG NeighborLoader + GCNConv does). Attribute rows ([E, D]) are no weights."""
    w = None if weight is None or weight.ndim != 1 else torch.from_numpy(weight)
    return compute_stats(conv, torch.from_numpy(src), torch.from_numpy(dst), w, num_nodes)
