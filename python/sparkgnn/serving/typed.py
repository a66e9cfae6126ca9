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
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError, StalePEStore, UnsupportedModelError
from sparkgnn.pe.typed_rounds import TypedRounds, UnionRows, check_local_rounds

if TYPE_CHECKING:
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.layers.hetero import EdgeType
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.pe.typed import TypedPEStore

log = logging.getLogger(__name__)

TYPED_MODES = ("full", "exact")


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
        if len(np.unique(ids)) != len(ids):
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
    directory; `mode`: "full" or "exact"; `store`: the opened TypedPEStore (exact needs it; it is
    checked against the model's and G's fingerprints)."""

    def __init__(
        self,
        graph: TypedGraphData | str | os.PathLike[str],
        model: HeteroModel | str | os.PathLike[str],
        *,
        mode: str = "full",
        store: TypedPEStore | None = None,
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
        if mode not in TYPED_MODES:
            raise SparkGNNError(f"typed serving mode {mode!r} is not one of {list(TYPED_MODES)}")
        check_local_rounds(model, "typed serving", "serve it with FULL on a homogeneous graph or run batch inference")
        if mode == "exact":
            if store is None:
                raise SparkGNNError("typed serving mode 'exact' reuses a typed PE store: pass store=")
            _check_store(store, graph, model)
        super().__init__(graph, model, store)
        self.mode = mode

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
        need = self._needed(prep)
        changed = need if self.mode == "full" else self._affected(prep, need)
        meter = {"fetch_s": 0.0, "nodes_recomputed": 0.0}
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
        out: dict[str, torch.Tensor] = {}
        for t, rows in prep.queries.items():
            if t in self.model.outputs and len(rows):
                have, h = values[t]
                out[t] = h[np.searchsorted(have, rows)]
        touched = float(sum(len(r) for level in need for r in level.values()))
        breakdown = {"compute_s": time.perf_counter() - started - meter["fetch_s"], **meter, "nodes_touched": touched}
        pred = {t: h.argmax(dim=-1) for t, h in out.items()} if self.model.output == "logits" else None
        return TypedAnswer(out, pred, breakdown)


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


__all__ = ["TypedAnswer", "TypedQueryEngine", "TypedRequest", "TypedRequestError", "TYPED_MODES", "union_rows"]
