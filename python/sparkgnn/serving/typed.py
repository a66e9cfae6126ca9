"""Serving on typed graphs: TypedQueryEngine answers typed requests (query nodes that carry a node
type, request edges that carry a relation) with a typed model (models/hetero.py), on one machine.

    full   the exact answer: the model on G + Q + request edges, read at the queries of the
           model's output types, computed on the typed k-hop in-neighbourhood of those queries
           from raw features. Going back from round k, a round needs a node of type T's value at
           round l-1 when it needs T's value at round l (its root term, or T kept), and the values
           of the sources of every in-edge of T in a relation of round l. Each needed node has all
           its in-edges, so every value on that neighbourhood is the union graph's (the
           homogeneous compgraph.py argument, per relation).
    exact  the same answer from the typed PE store (pe/typed.py): a node's value at round l changes
           only if it is a query, if one of its in-edges at round l is a request edge or comes
           from a node changed at round l-1, or if its own value at round l-1 changed and round l
           reads it (root term, kept type). Only those nodes (within the k-hop neighbourhood) are
           recomputed, each relation into them over all their in-edges; every other value is the
           stored h^(l) of its type. EXACT therefore equals FULL.
    he     historical embeddings (OMEGA's HE, serving/plans.py): only the queries are computed,
           at every round, reading every vertex of G from the store.
    srpe   selective recomputation (OMEGA's SRPE): HE, plus the top ceil(gamma |R|) candidates R
           (vertices of G with a request edge into a query, of any type) chosen by a policy,
           recomputed at rounds 1..k-1 where the answer reads them. Policies: "qer" (the paper's
           top-query-edges ratio |N_Q(u)| / |N(u)|, in-edges over every relation into u's type
           in the union graph) and "random" (seeded by seed and the request id).

HE and SRPE are exact, as on homogeneous graphs, where no value they read from the store moved:
requests whose edges all point into queries (no vertex of G changes), and SRPE with every changed
vertex it reads chosen (gamma = 1 on a 2-round model). Typed serving answers only what it can
prove exact: a request on which a stored value HE or SRPE reads belongs to a vertex the request
changed (EXACT's changed set over the same neighbourhood) is refused naming how many and where,
unless the engine was built with approximate=True, which answers it the paper's way and reports
the count of those stale reads as `stale_rows` in the breakdown (0 on an exact answer). That
search walks FULL's neighbourhood (index arrays, no values computed); a request whose edges all
point into queries is known exact without it.

Threads: one engine answers on several threads at once (the typed online service runs one per
served mode on its pools' threads). Everything a call computes is its own; what the engine builds
lazily (SRPE's in-degrees per type) is built once under its lock and only read afterwards, as is
the typed PE store's layer table (pe/store.py).

WHY typed SRPE recomputes a chosen vertex over all its in-edges (the sources read from the store
unless they are queries or chosen ones) instead of merging a stored per-relation state with the
query messages: the typed store keeps no states (next paragraph), and where nothing stale is read
both give the same value, for every aggregator. Its default gamma is 1: a smaller budget can only
leave changed candidates stale, which the refusal above turns away.

WHY each affected node recomputes its relations over all its in-edges instead of merging a stored
per-relation state with the changed edges: the per-type embeddings are all that is stored (pe/typed.py),
the in-neighbourhood of one node is small next to the k-hop neighbourhood FULL reads, and the result
stays exact for every conv a typed relation runs, whatever its aggregator.

Refused, naming the relation: a relation within one type whose conv needs node statistics (GCN's
degrees: a k-hop neighbourhood misses the degrees of its frontier) or runs several passes over the
edges (its neighbourhood is deeper than one round). Requests are checked before anything runs:
unknown types and relations, query ids that name vertices of G, duplicate queries, feature widths,
endpoints that are neither queries nor vertices of their type, edges between two vertices of G (a
graph update, not a query) and requests without a query are refused in one line.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from sparkgnn import npsets
from sparkgnn.errors import SparkGNNError, StalePEStore, UnsupportedModelError
from sparkgnn.pe.typed_rounds import TypedRounds, UnionRows, check_local_rounds

if TYPE_CHECKING:
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.layers.hetero import EdgeType
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.pe.typed import TypedPEStore

log = logging.getLogger(__name__)

TYPED_MODES = ("full", "he", "srpe", "exact")
TYPED_POLICIES = ("qer", "random")
# Per mode, the options it takes besides mode and store (every mode takes seed, as QueryEngine's).
_MODE_OPTIONS = {
    "full": ("seed",),
    "he": ("seed", "approximate"),
    "srpe": ("seed", "approximate", "gamma", "policy"),
    "exact": ("seed",),
}


class TypedRequestError(SparkGNNError, ValueError):
    """A typed serving request is malformed (module doc); the message names the type or relation,
    `problem` is the message without the request's id."""

    problem: str = ""


@dataclass
class TypedRequest:
    """New query nodes per node type and the request edges that attach them, per relation.
    `nodes`: {type: (ids, x)} (x [q, F] float32 of the type's width, None for a type whose
    vertices have no features); `edges`: {(src type, relation, dst type): (src ids, dst ids)},
    each endpoint a query of its type or a vertex of G of its type, at least one a query."""

    nodes: Mapping[str, tuple[Any, Any]]
    edges: Mapping[tuple[str, str, str], tuple[Any, Any]] = field(default_factory=dict)
    request_id: str = "request"

    # What the streaming job's handler reads of every request, as of a homogeneous Request.
    @property
    def qid(self) -> np.ndarray:
        """Every query id, type after type in `nodes` order (the order of `qtype`)."""
        parts = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids, _ in self.nodes.values()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @property
    def qtype(self) -> list[str]:
        """The node type of each entry of `qid`."""
        return [t for t, (ids, _) in self.nodes.items() for _ in range(np.asarray(ids).size)]

    @property
    def batch_size(self) -> int:
        return int(sum(np.asarray(ids).size for ids, _ in self.nodes.values()))

    @property
    def num_edges(self) -> int:
        return int(sum(np.asarray(src).size for src, _ in self.edges.values()))

    def problems(self, graph: TypedGraphData) -> list[str]:
        """The request's first problem against G as one sentence (empty when valid): the checks of
        TypedQueryEngine.prepare with G's feature widths, so an answerable request passes both."""
        widths = {t: max(n.feature_dim, 1) for t, n in graph.nodes.items()}
        sizes = {t: n.num_nodes for t, n in graph.nodes.items()}
        try:
            union_rows(graph, self, widths, sizes)
        except TypedRequestError as exc:
            return [exc.problem]
        return []


@dataclass
class TypedAnswer:
    """h: per output type with queries, the model's output at those queries (request order);
    pred: the argmax per type for logits models (else None); breakdown: compute_s, fetch_s (store
    reads), nodes_recomputed (vertices of G whose round >= 1 value was computed), nodes_touched."""

    h: dict[str, torch.Tensor]
    pred: dict[str, torch.Tensor] | None
    breakdown: dict[str, float]


def check_typed_mode(mode: str, options: Mapping[str, Any]) -> None:
    """Refuse (SparkGNNError, one line) a mode that is not in TYPED_MODES or an option the mode does
    not take or accept (TypedQueryEngine's doc), before anything is loaded."""
    if mode not in TYPED_MODES:
        raise SparkGNNError(f"typed serving mode {mode!r} is not one of {list(TYPED_MODES)}")
    unknown = sorted(set(options) - set(_MODE_OPTIONS[mode]))
    if unknown:
        raise SparkGNNError(
            f"typed serving mode {mode!r} does not take option(s) {unknown} (it takes {list(_MODE_OPTIONS[mode])})"
        )
    gamma = options.get("gamma", 1.0)
    if not isinstance(gamma, (int, float)) or not 0.0 <= float(gamma) <= 1.0:
        raise SparkGNNError(f"typed serving mode 'srpe': gamma must be a number in [0, 1], got {gamma!r}")
    policy = options.get("policy", "qer")
    if policy not in TYPED_POLICIES:
        raise SparkGNNError(f"typed serving mode 'srpe': policy {policy!r} is not one of {list(TYPED_POLICIES)}")


def _fail(request: TypedRequest, what: str) -> TypedRequestError:
    error = TypedRequestError(f"typed request {request.request_id!r}: {what}")
    error.problem = what
    return error


def union_rows(
    graph: TypedGraphData, request: TypedRequest, widths: Mapping[str, int], sizes: Mapping[str, int]
) -> UnionRows:
    """The request checked against G (module doc; TypedRequestError naming the first problem) and
    mapped to union rows: a query of type T gets row sizes[T] + its position, its features the
    width widths[T] (a type without features in G: a column of ones of that width)."""
    known = ", ".join(graph.node_types)
    queries: dict[str, np.ndarray] = {}
    xs: dict[str, torch.Tensor] = {}
    lookups: dict[str, dict[int, int]] = {}
    for t, (ids, x) in request.nodes.items():
        if t not in graph.nodes:
            raise _fail(request, f"node type {t!r} is unknown (node types: {known})")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if len(npsets.unique(ids)) != len(ids):
            raise _fail(request, f"node type {t!r}: query ids repeat")
        clash = ids[graph.nodes[t].id_index.lookup(ids)[1]]
        if len(clash):
            raise _fail(request, f"node type {t!r}: query ids {clash[:5].tolist()} name vertices of G")
        width, has = widths[t], graph.nodes[t].feature_dim
        if has == 0:
            if x is not None:
                raise _fail(request, f"node type {t!r} has no features in G; its queries carry none (x=None)")
            feats = torch.ones(len(ids), width)
        elif x is None:
            raise _fail(request, f"node type {t!r}: its queries carry no features, expected [{len(ids)}, {width}]")
        else:
            feats = torch.as_tensor(np.asarray(x, dtype=np.float32))
            if feats.dim() != 2 or feats.shape != (len(ids), width):
                raise _fail(
                    request, f"node type {t!r}: x has shape {tuple(feats.shape)}, expected [{len(ids)}, {width}]"
                )
            if not torch.isfinite(feats).all():
                raise _fail(request, f"node type {t!r}: x holds NaN or Inf")
        n = sizes[t]
        queries[t] = np.arange(n, n + len(ids), dtype=np.int64)
        xs[t] = feats
        lookups[t] = {int(i): n + k for k, i in enumerate(ids)}
    if not any(len(q) for q in queries.values()):
        raise _fail(request, "no query node")
    edges: dict[EdgeType, tuple[np.ndarray, np.ndarray]] = {}
    for et, (src, dst) in request.edges.items():
        et = cast("EdgeType", tuple(et))
        if et not in graph.edges:
            raise _fail(request, f"relation {et} is unknown (relations: {graph.edge_types})")
        rows = []
        for t, ids in ((et[0], src), (et[2], dst)):
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            g_rows, found = graph.nodes[t].id_index.lookup(ids)
            q = lookups.get(t, {})
            mapped = np.asarray([q.get(int(i), -1) for i in ids], dtype=np.int64).reshape(-1)
            unknown = ids[(mapped < 0) & ~found]
            if len(unknown):
                raise _fail(
                    request,
                    f"relation {et}: endpoints {unknown[:5].tolist()} are neither queries nor {t!r} vertices",
                )
            rows.append(np.where(mapped >= 0, mapped, g_rows).astype(np.int64))
        if len(rows[0]) != len(rows[1]):
            raise _fail(request, f"relation {et}: {len(rows[0])} sources but {len(rows[1])} destinations")
        inside = (rows[0] < sizes[et[0]]) & (rows[1] < sizes[et[2]])
        if inside.any():
            raise _fail(request, f"relation {et}: edges between two vertices of G are a graph update, not a query")
        edges[et] = (rows[0], rows[1])
    return UnionRows(queries, xs, edges)


class TypedQueryEngine(TypedRounds):
    """Answers typed requests against the typed graph G with a typed model (module doc).

    `graph`: a TypedGraphData or a typed graph directory; `model`: a HeteroModel or its saved
    directory; `mode`: a name in TYPED_MODES; `store`: the opened TypedPEStore (he, srpe and exact
    need it; it is checked against the model's and G's fingerprints). Mode options (keywords):
    `seed` (every mode; srpe's "random" policy reads it), `approximate` (he, srpe: answer a request
    they cannot answer exactly instead of refusing it, module doc), `gamma` in [0, 1] (srpe,
    default 1.0) and `policy` (srpe, one of TYPED_POLICIES, default "qer")."""

    def __init__(
        self,
        graph: TypedGraphData | str | os.PathLike[str],
        model: HeteroModel | str | os.PathLike[str],
        *,
        mode: str = "full",
        store: TypedPEStore | None = None,
        **options: Any,
    ):
        from sparkgnn.graph.typed import TypedGraphData
        from sparkgnn.models.hetero import HeteroModel

        if isinstance(graph, (str, os.PathLike)):
            from sparkgnn.graph.typed_io import read_typed_graph_dir

            graph = read_typed_graph_dir(os.fspath(graph))
        if not isinstance(graph, TypedGraphData):
            raise UnsupportedModelError(
                f"typed serving runs on a typed graph (TypedGraphData or its directory), not {type(graph).__name__}"
            )
        if isinstance(model, (str, os.PathLike)):
            model = HeteroModel.load(os.fspath(model))
        if not isinstance(model, HeteroModel):
            raise UnsupportedModelError(f"typed serving runs a typed model (a HeteroModel), not {type(model).__name__}")
        model.check_metadata(graph.metadata(), where=f"graph {graph.name!r}")
        check_typed_mode(mode, options)
        self.seed = int(options.get("seed", 0))
        self.approximate = bool(options.get("approximate", False))
        self.gamma = float(options.get("gamma", 1.0))
        self.policy = str(options.get("policy", "qer"))
        check_local_rounds(model, "typed serving", "serve it with FULL on a homogeneous graph or run batch inference")
        if mode != "full":
            if store is None:
                raise SparkGNNError(f"typed serving mode {mode!r} reuses a typed PE store: pass store=")
            _check_store(store, graph, model)
        super().__init__(graph, model, store)
        self.mode = mode
        self._in_degree: dict[str, np.ndarray] = {}  # node type -> G in-degree over its relations (qer)
        self._lock = threading.Lock()  # builds _in_degree once however many threads answer (module doc)

    @property
    def mode_name(self) -> str:
        """The mode's name, as QueryEngine.mode_name gives it (the streaming job's rows carry it)."""
        return self.mode

    # -- requests --------------------------------------------------------------------------------
    def prepare(self, request: TypedRequest) -> UnionRows:
        """The request checked (module doc) and mapped to union rows."""
        return union_rows(self.graph, request, self.model.in_dims, self._sizes)

    # -- answering -------------------------------------------------------------------------------
    def answer(self, request: TypedRequest) -> TypedAnswer:
        """The model's output at the request's queries of its output types (module doc)."""
        started = time.perf_counter()
        prep = self.prepare(request)
        extra: dict[str, float] = {}
        if self.mode in ("he", "srpe"):
            changed, need = self._reuse_rows(prep, request, extra)
        else:
            need = self._needed(prep)
            changed = need if self.mode == "full" else self._affected(prep, need)
        meter = {"fetch_s": 0.0, "nodes_recomputed": 0.0}
        values = self.run_rounds(prep, changed, meter)
        out: dict[str, torch.Tensor] = {}
        for t, rows in prep.queries.items():
            if t in self.model.outputs and len(rows):
                have, h = values[t]
                out[t] = h[np.searchsorted(have, rows)]
        touched = float(sum(len(r) for level in need for r in level.values()))
        breakdown = {
            "compute_s": time.perf_counter() - started - meter["fetch_s"],
            **meter,
            "nodes_touched": touched,
            **extra,
        }
        pred = {t: h.argmax(dim=-1) for t, h in out.items()} if self.model.output == "logits" else None
        return TypedAnswer(out, pred, breakdown)

    # -- he / srpe ---------------------------------------------------------------------------------
    def _reuse_rows(
        self, prep: UnionRows, request: TypedRequest, extra: dict[str, float]
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """HE's or SRPE's rows (module doc): (per round 0..k, the rows computed; per round, the
        rows computed or read). Going back from the output queries like _needed, a row read at
        round l is computed when it is a query or (1 <= l < k) a chosen candidate, else read from
        the store (round 0: G's features). Refuses (TypedRequestError) a request on which a
        stored value read belongs to a vertex the request changed, unless `approximate`."""
        k = len(self.rounds)
        chosen = self._chosen(prep, request, extra) if self.mode == "srpe" else {}
        computed: list[dict[str, np.ndarray]] = [{} for _ in range(k + 1)]
        touched: list[dict[str, np.ndarray]] = [{} for _ in range(k + 1)]
        computed[k] = {t: rows for t, rows in prep.queries.items() if t in self.model.outputs and len(rows)}
        touched[k] = computed[k]
        for l in range(k, 0, -1):
            rnd = self.rounds[l - 1]
            below: dict[str, list[np.ndarray]] = {}
            for t, rows in computed[l].items():
                if t in rnd.keep or t in rnd.dst_types:
                    below.setdefault(t, []).append(rows)
                for et in rnd.edge_types:
                    if et[2] == t:
                        below.setdefault(et[0], []).append(self._in_edges(et, rows, prep)[0])
            for t, parts in below.items():
                rows = npsets.unique(np.concatenate(parts))
                touched[l - 1][t] = rows
                mine = rows >= self._sizes[t]
                if 1 <= l - 1 < k and t in chosen:
                    mine |= np.isin(rows, chosen[t])
                computed[l - 1][t] = rows[mine]
        stale = self._stale_reads(prep, computed, touched)
        extra["stale_rows"] = float(sum(n for _, _, n in stale))
        if stale and not self.approximate:
            where = ", ".join(f"{n} {t!r} at round {l}" for l, t, n in stale)
            remedy = "serve it with mode 'exact'" + (" or a larger gamma" if self.mode == "srpe" else "")
            raise _fail(
                request,
                f"mode {self.mode!r} cannot answer it exactly: it reads stored values of vertices of G the "
                f"request changes ({where}); {remedy}, or build the engine with approximate=True",
            )
        return computed, touched

    def _stale_reads(
        self, prep: UnionRows, computed: list[dict[str, np.ndarray]], touched: list[dict[str, np.ndarray]]
    ) -> list[tuple[int, str, int]]:
        """(round, type, count) of the rows read from the store whose value the request changes:
        EXACT's changed set (_affected) on FULL's neighbourhood, which holds every row HE / SRPE
        read. None when every request edge points into a query (no vertex of G changes)."""
        into_g = any(bool((d < self._sizes[et[2]]).any()) for et, (_, d) in prep.edges.items())
        if not into_g:
            return []
        affected = self._affected(prep, self._needed(prep))
        out = []
        for l in range(1, len(self.rounds)):
            for t, rows in touched[l].items():
                moved = affected[l].get(t, np.empty(0, np.int64))
                read = rows[(rows < self._sizes[t]) & ~np.isin(rows, computed[l].get(t, ()))]
                n = int(np.isin(read, moved).sum())
                if n:
                    out.append((l, t, n))
        return out

    def _chosen(self, prep: UnionRows, request: TypedRequest, extra: dict[str, float]) -> dict[str, np.ndarray]:
        """SRPE's recomputed candidates per node type: the top ceil(gamma |R|) of the candidates R
        by the policy's score (ties: node type order, then row)."""
        found: dict[str, list[np.ndarray]] = {}
        for et, (src, dst) in prep.edges.items():
            into_query = (src < self._sizes[et[0]]) & (dst >= self._sizes[et[2]])
            found.setdefault(et[0], []).append(src[into_query])
        unique = {t: npsets.unique(np.concatenate(parts)) for t, parts in found.items()}
        types = [t for t in self.graph.node_types if len(unique.get(t, ()))]
        cands = [unique[t] for t in types]
        total = int(sum(len(c) for c in cands))
        budget = min(total, int(math.ceil(self.gamma * total - 1e-9)))
        extra.update(candidates=float(total), chosen=float(budget))
        if budget == 0:
            return {}
        if self.policy == "random":
            scores = np.random.default_rng([self.seed, zlib.crc32(request.request_id.encode())]).random(total)
        else:
            scores = np.concatenate([self._qer(prep, t, rows) for t, rows in zip(types, cands, strict=True)])
        order = np.lexsort((np.arange(total), -scores))[:budget]
        bounds = np.cumsum([0] + [len(c) for c in cands])
        return {
            t: np.sort(rows[order[(order >= a) & (order < b)] - a])
            for t, rows, a, b in zip(types, cands, bounds[:-1], bounds[1:], strict=True)
        }

    def _qer(self, prep: UnionRows, node_type: str, rows: np.ndarray) -> np.ndarray:
        """|N_Q(u)| / |N(u)| at G rows `rows` of `node_type`: request in-edges from queries over
        all in-edges in the union graph, over every relation into the type."""
        degree = self._in_degree.get(node_type)
        if degree is None:
            with self._lock:
                degree = self._in_degree.get(node_type)
                if degree is None:
                    degree = self._in_degree[node_type] = self._build_in_degree(node_type)
        nq = np.zeros(len(rows), np.int64)
        for et, (src, dst) in prep.edges.items():
            if et[2] == node_type:
                hit = dst[(src >= self._sizes[et[0]]) & (dst < self._sizes[node_type])]
                hit = hit[np.isin(hit, rows)]
                nq += np.bincount(np.searchsorted(rows, hit), minlength=len(rows))
        deg = degree[rows] + nq
        return np.where(deg > 0, nq / np.maximum(deg, 1), 0.0)

    def _build_in_degree(self, node_type: str) -> np.ndarray:
        """G's in-degree of every vertex of `node_type`, over every relation into the type."""
        deg = np.zeros(self._sizes[node_type], np.int64)
        for et, (_, dst) in self._csc.items():
            if et[2] == node_type:
                deg += np.bincount(dst, minlength=len(deg))[: len(deg)]
        return deg


def _check_store(store: TypedPEStore, graph: TypedGraphData, model: HeteroModel) -> None:
    """Raise StalePEStore unless the store holds this model's typed PEs over this graph."""
    manifest = getattr(store, "manifest", None) or {}
    differs = [
        what
        for what, key, want in (
            ("graph", "graph_fingerprint", graph.fingerprint),
            ("model", "model_fingerprint", model.fingerprint()),
        )
        if manifest.get(key) != want
    ]
    if differs:
        raise StalePEStore(
            f"typed PE store {getattr(store, 'base', store)} does not belong to this engine: its "
            f"{' and '.join(differs)} fingerprint differs; open the store computed for this model and graph"
        )


__all__ = [
    "TYPED_MODES",
    "TYPED_POLICIES",
    "TypedAnswer",
    "TypedQueryEngine",
    "TypedRequest",
    "TypedRequestError",
    "check_typed_mode",
    "union_rows",
]
