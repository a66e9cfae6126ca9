"""Incremental refresh of a typed PE store (pe/typed.py) on one machine: apply a typed graph
update (graph/updates/typed.py) and recompute, round by round, only the vertices of each type
whose value the update changes.

Which vertices change at round l (the argument of typed EXACT serving, serving/typed.py, with the
update in place of a request): a vertex of type T changes if it was inserted, if round 0 and its
features changed, if round l reads T's own previous value (T is a destination of the round or
kept) and it changed at round l-1, if it gained or lost an in-edge in a relation of round l, or
if one of its in-edges in such a relation comes from a vertex that changed at round l-1. Every
other vertex keeps the value the old store holds for its id.

WHY recompute a changed vertex from all its in-edges instead of merging stored states with the
changed edges: the typed store holds per-type embeddings only (no aggregation states per
relation), the in-edges of one vertex are few, and the result is exact for every conv a typed
relation runs, whatever its aggregator. Each changed vertex runs the typed round
(pe/typed_rounds.py, shared with typed serving) over the updated graph, reading unchanged
neighbours from the old store: one code path computes typed EXACT answers and typed refreshes.

The new version is keyed by the updated graph's fingerprint and written whole, type by type
(TypedPEWriter), next to the old version, which stays untouched; typed.json is written last,
with a "refresh" entry naming the previous graph fingerprint and the update's counts. Refused,
naming the relation, like typed serving: a relation whose conv needs node statistics over the
whole relation (GCN's degrees) or takes several passes over the edges. The Spark refresh job
does not run typed stores (engine/api.py refuses them).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from sparkgnn import npsets
from sparkgnn.pe.refresh import RefreshError, RefreshReport
from sparkgnn.pe.typed import TypedPEStore, TypedPEWriter, check_typed_inputs, typed_graph_fingerprint
from sparkgnn.pe.typed_rounds import TypedRounds, UnionRows, check_local_rounds

if TYPE_CHECKING:
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.graph.updates.typed import TypedApplied, TypedGraphUpdate
    from sparkgnn.models.hetero import HeteroModel

log = logging.getLogger(__name__)


def check_refreshable(model: HeteroModel) -> None:
    """Refuse (UnsupportedModelError, one line naming the round and relation) a typed model whose
    relations a refresh cannot recompute vertex by vertex (module doc)."""
    check_local_rounds(model, "typed PE refresh", "recompute the store with precompute_local")


def _changed_rows(
    model: HeteroModel, applied: TypedApplied
) -> tuple[list[dict[str, np.ndarray]], dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]]]:
    """Per round 0..k, the sorted rows of the updated graph whose value the update changes
    (module doc), and each relation's (src rows, dst rows) in the updated graph."""
    graph = applied.graph
    index = {et: graph.edge_index(et) for et in graph.edge_types}
    empty = np.empty(0, np.int64)
    changed: list[dict[str, np.ndarray]] = [dict(applied.feature_changed)]
    inserted = {t: np.flatnonzero(rows < 0) for t, rows in applied.old_rows.items()}
    for rnd in model.round_list():
        below = changed[-1]
        level: dict[str, np.ndarray] = {}
        for t in rnd.out_types:
            parts = [inserted[t], below.get(t, empty)]  # out types read their own previous value
            for et in rnd.edge_types:
                if et[2] != t:
                    continue
                src, dst = index[et]
                parts += [applied.edge_changed_dst[et], dst[np.isin(src, below.get(et[0], empty))]]
            level[t] = npsets.unique(np.concatenate(parts).astype(np.int64))
        changed.append(level)
    return changed, index


def _rounds_engine(graph: TypedGraphData, model: HeteroModel, store: TypedPEStore) -> TypedRounds:
    """The rounds over the updated graph whose unchanged values come from the old store (by id:
    an unchanged vertex's value is the old graph's)."""
    return TypedRounds(graph, model, store)


@torch.no_grad()
def refresh_typed_local(
    graph: TypedGraphData,
    update: TypedGraphUpdate,
    model: HeteroModel | str | os.PathLike[str],
    store_root,
    *,
    out_graph=None,
    store: TypedPEStore | None = None,
    verify: str = "checksums",
) -> tuple[TypedPEStore, RefreshReport]:
    """Apply the typed `update` to `graph` and to the typed PE store at `store_root` computed for
    (graph, model); commit the refreshed store as the updated graph's version under the same root
    and return it opened (verified) with a report (per round: vertices recomputed per type).
    `out_graph`: also write the updated graph there (a typed graph directory). `store`: the old
    version already open. A bad update is refused (GraphUpdateError, one line naming the type or
    relation) before anything is written."""
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.graph.updates.typed import TypedGraphUpdate, apply_typed
    from sparkgnn.models.hetero import HeteroModel

    started = time.perf_counter()
    if not isinstance(graph, TypedGraphData) or not isinstance(update, TypedGraphUpdate):
        raise RefreshError(
            f"a typed PE refresh takes a TypedGraphData and a TypedGraphUpdate, not "
            f"{type(graph).__name__} and {type(update).__name__}"
        )
    if isinstance(model, (str, os.PathLike)):
        model = HeteroModel.load(os.fspath(model))
    check_typed_inputs(graph, model)
    check_refreshable(model)
    if store is None:
        store = TypedPEStore.open(store_root, model=model, graph=graph, verify=verify)
    elif store.manifest.get("graph_fingerprint") != typed_graph_fingerprint(graph):
        raise RefreshError(f"typed PE store {store.base} given to refresh_local is not the one of this graph")
    applied = apply_typed(update, graph)
    new_graph = applied.graph
    if out_graph is not None:
        from sparkgnn.graph.typed_io import write_typed_graph_dir

        write_typed_graph_dir(new_graph, out_graph)
    report = RefreshReport(
        store="",
        graph_fingerprint=new_graph.fingerprint,
        previous_graph_fingerprint=store.manifest["graph_fingerprint"],
        updates=update.counts(),
    )
    if report.graph_fingerprint == report.previous_graph_fingerprint:
        log.info(f"sparkgnn refresh: the typed update leaves the graph as it was; {store.base} stays current")
        report.store = store.base
        return store, report
    changed, _ = _changed_rows(model, applied)
    engine = _rounds_engine(new_graph, model, store)
    prep = UnionRows({}, {}, {})
    meter = {"fetch_s": 0.0, "nodes_recomputed": 0.0}
    values = {t: (rows, engine._inputs(prep, t, rows)) for t, rows in changed[0].items() if len(rows)}
    writer = TypedPEWriter(store_root, new_graph, model)
    for l, rnd in enumerate(engine.rounds, start=1):
        began = time.perf_counter()
        previous, values = values, {}
        for t, rows in changed[l].items():
            if len(rows):
                values[t] = (rows, engine._round(rnd, l, t, rows, prep, previous, changed, meter))
        for t in writer.types_at(l):
            if l not in writer.done(t):
                writer.commit_arrays(l, t, new_graph.nodes[t].ids, _whole(store, new_graph, t, l, values.get(t)))
        report.layers.append(
            {
                "layer": l,
                "targets": {t: int(len(rows)) for t, rows in changed[l].items()},
                "seconds": round(time.perf_counter() - began, 4),
                "committed": "whole",
            }
        )
        log.info(
            f"sparkgnn refresh: typed round {l}/{model.num_rounds}: recomputed "
            + ", ".join(f"{t} {len(rows)} of {new_graph.nodes[t].num_nodes}" for t, rows in changed[l].items())
        )
    report.seconds = round(time.perf_counter() - started, 3)
    chain = list((store.manifest.get("refresh") or {}).get("chain") or [store.manifest["graph_fingerprint"]])
    writer.finish(report.seconds, refresh={**report.to_json(), "chain": [*chain, report.graph_fingerprint]})
    report.store = writer.base
    refreshed = TypedPEStore.open(store_root, model=model, graph=new_graph, verify=verify)
    report.seconds = round(time.perf_counter() - started, 3)
    return refreshed, report


def _whole(store: TypedPEStore, graph: TypedGraphData, node_type: str, layer: int, fresh) -> np.ndarray:
    """Layer `layer` of `node_type` in the updated graph's row order: the recomputed rows from
    `fresh` ((rows, h) or None), every other row the old store's value of its id."""
    ids = graph.nodes[node_type].ids
    width = store.width(node_type, layer)
    out = np.empty((len(ids), width), np.float32)
    stale = np.ones(len(ids), bool)
    if fresh is not None:
        rows, h = fresh
        out[rows] = h.numpy()
        stale[rows] = False
    if stale.any():
        out[stale] = store.lookup(node_type, ids[stale], layer)
    return out


__all__ = ["check_refreshable", "refresh_typed_local"]
