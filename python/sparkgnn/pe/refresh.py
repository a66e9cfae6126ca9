"""Incremental PE refresh on one machine: apply a graph update to a PE store, layer by layer,
recomputing only the vertices the update reaches (pe/refresh_kernel.py says which and how).

WHY a new store version and not an in-place edit: a store is keyed by (graph fingerprint, model
fingerprint) and serving refuses a store whose graph differs from its own, so the refreshed
embeddings belong to the updated graph's key, <store>/<new graph fp>/<model fp>/, committed with
the same writer protocol as a precompute (lease, attempt folders, one manifest write per layer).
Each layer of the new version is committed as a DELTA over the old version's layer (only the
recomputed rows and a tombstone per deleted vertex are written; pe/versions.py), or whole when
the change reaches half the layer or the chain of deltas is long. So the new version lies on the
old one's files: the old version stays readable and untouched, and must be kept while a newer
version lies on it (PEStore.open names a deleted base as damage). A refresh killed midway
leaves the new version's manifest without its last layers, and a rerun recomputes in memory
(cheap: only the change) and commits only the layers still missing, giving the same store.
The manifest's "refresh" entry records where it came from: the previous graph fingerprint, the
update's counts, per-layer targets, and the chain of graph fingerprints back to the first
precompute.

This path holds the graph in memory (like precompute_local); of the old store it reads, per
layer, only the rows the change needs from the layers' row files (pe/rowfile.py, memory-mapped),
or the layer whole when it has none (a store written before them, or by Spark) or is already
held in memory. For stores that do not fit one machine, engine/refresh runs the same kernel on
pieces of the graph in Spark tasks and commits the same versions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.layers.generic import require_states
from sparkgnn.pe import versions
from sparkgnn.pe.local import whole_layer
from sparkgnn.pe.lookup import SortedTable
from sparkgnn.pe.refresh_kernel import GraphStats, LayerChange, Side, compute_layer, plan_layer
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter, layer_key

log = logging.getLogger(__name__)

# A layer whose planned targets are at least this share of the graph's vertices is computed over
# every vertex as the precompute computes it (pe/local.whole_layer): one pass over every edge costs
# less than the delta / scratch kernel's per-target gathers once the targets are most of the graph
# (a GCN batch whose degree changes reach nearly every vertex; docs/ARCHITECTURE.md).
WHOLE_LAYER_FRACTION = 0.5


class RefreshError(SparkGNNError, ValueError):
    """A refresh that cannot run: no stored states, a store for another graph or model."""


@dataclass
class RefreshReport:
    """What a refresh did: per layer, the vertices recomputed by delta and from scratch and the
    messages computed (new) and removed (old); seconds; where the new version lives."""

    store: str
    graph_fingerprint: str
    previous_graph_fingerprint: str
    updates: dict
    layers: list = field(default_factory=list)
    phases: dict = field(default_factory=dict)  # seconds: open, apply, fingerprint, layers, finish, verify
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.require(a, np.float32, ["C", "W"]))


class StoredLayer:
    """Layer l of the old version, read by old-graph row: row by row from its row files
    (rowfile.py: a cold refresh reads only the rows it needs), or from the layer held whole in
    memory (a store whose layers were loaded before, or one without row files)."""

    def __init__(self, store: PEStore, graph, layer: int):
        from sparkgnn.pe.lookup import UnknownIds

        self.what = f"PE store {store.base} layer {layer}"
        self.ids = graph.ids
        self.rows = None if store.loaded(layer) else store.rows(layer)
        self.table: SortedTable | None = None
        if self.rows is not None:
            if "state" not in self.rows.columns:
                raise RefreshError(f"{self.what} has no stored states")
            return
        self.table = store.table(layer)
        if "state" not in self.table.columns:
            raise RefreshError(f"{self.what} has no stored states")
        try:
            self.stored_pos = self.table.positions(graph.ids)
        except UnknownIds as exc:
            raise RefreshError(f"{self.what} lacks vertices of the graph: {exc}") from exc

    @property
    def rows_read(self) -> int | None:
        """Rows fetched from the row files so far (None: the layer was read whole)."""
        return None if self.rows is None else self.rows.rows_read

    def values(self, old_rows: np.ndarray, column: str) -> np.ndarray:
        """`column` ("h" or "state") of old-graph rows, float32 [n, w]."""
        if self.table is not None:
            return self.table.columns[column][self.stored_pos[old_rows]]
        from sparkgnn.pe.lookup import UnknownIds

        assert self.rows is not None  # __init__ sets one of table and rows
        try:
            return self.rows.get(self.ids[old_rows], column)
        except UnknownIds as exc:
            raise RefreshError(f"{self.what} lacks vertices of the graph: {exc}") from exc


class StoredRows(Protocol):
    """Layer l of the old version read by old-graph row: a StoredLayer, or the follower's rows
    held in memory over its last committed version (pe/follow.py)."""

    def values(self, old_rows: np.ndarray, column: str) -> np.ndarray: ...

    @property
    def rows_read(self) -> int | None: ...


@dataclass
class RefreshedLayer:
    """Layer l of the updated graph as a refresh knows it: the stored rows of the old version
    (`stored`) with the recomputed `rows` (sorted new-graph rows) replaced by `h` and `state`.
    WHY not one full array: gathering every stored row into new-graph order costs O(N) copies
    per layer, as much as a small update's whole computation; only a layer written whole
    (compaction) needs them (`full`)."""

    layer: int
    stored: StoredRows
    old_rows: np.ndarray
    rows: np.ndarray
    h: torch.Tensor
    state: torch.Tensor

    def old_values(self, rows: np.ndarray) -> torch.Tensor:
        """Stored h^(l) of old-graph rows."""
        return _tensor(self.stored.values(rows, "h"))

    def new_values(self, rows: np.ndarray) -> torch.Tensor:
        """h^(l) of new-graph rows: recomputed where the refresh recomputed them, else stored."""
        rows = np.asarray(rows, np.int64)
        at = np.minimum(np.searchsorted(self.rows, rows), max(len(self.rows) - 1, 0))
        fresh = (self.rows[at] == rows) if len(self.rows) else np.zeros(len(rows), bool)
        out = torch.empty(len(rows), self.h.shape[1])
        out[torch.from_numpy(fresh)] = self.h[torch.from_numpy(at[fresh])]
        kept = ~fresh
        if kept.any():
            out[torch.from_numpy(kept)] = self.old_values(self.old_rows[rows[kept]])
        return out

    def full(self, column: str) -> np.ndarray:
        """The whole column in new-graph row order."""
        fresh = self.h if column == "h" else self.state
        out = np.empty((len(self.old_rows), fresh.shape[1]), np.float32)
        kept = np.flatnonzero(self.old_rows >= 0)
        out[kept] = self.stored.values(self.old_rows[kept], column)
        out[self.rows] = fresh.numpy()
        return out


@torch.no_grad()
def refreshed_layers(graph, applied, model, store: PEStore | None, *, stored=None, indexes=None, graph_stats=None):
    """Yield (RefreshedLayer, stats dict) of the updated graph for l = 1..k, recomputing only
    what the update reaches (the rows recomputed include every inserted vertex). `stored`: a
    function of l giving layer l of the old version (an object with `values(old_rows, column)`
    and `rows_read`, as StoredLayer), instead of reading `store` (the follower's rows held in
    memory over the last committed version, pe/follow.py). `indexes`: (EdgeIndex of `graph`, EdgeIndex
    of `applied.graph`) (pe/edge_index.py), from which the planning finds the edges of the change
    instead of passing over every edge (the follower keeps them up to date per batch). `graph_stats`: the
    GraphStats (pe/refresh_kernel.py) the two graphs' node statistics are computed in once for
    every layer (the follower's own, which its next batch finds this batch's new graph in)."""
    if store is None and stored is None:
        raise ValueError("refreshed_layers reads the old version from a store or from `stored`; neither was given")
    new_graph = applied.graph
    changed = np.asarray(applied.feature_changed, np.int64)
    previous: RefreshedLayer | None = None
    graph_stats = graph_stats if graph_stats is not None else GraphStats()
    for l, conv in enumerate(model.convs, start=1):
        if previous is None:
            old_values = lambda rows: model.pre(_tensor(graph.x[rows]))  # noqa: E731
            new_values = lambda rows: model.pre(_tensor(new_graph.x[rows]))  # noqa: E731
        else:
            old_values, new_values = previous.old_values, previous.new_values
        old_index, new_index = indexes if indexes is not None else (None, None)
        old = Side.of(conv, graph, old_values, index=old_index, stats=graph_stats)
        graph_stats.follow(graph, applied)  # the new graph's statistics that follow from the old one's
        new = Side.of(conv, new_graph, new_values, index=new_index, stats=graph_stats)
        started = time.perf_counter()
        layer_stored = stored(l) if stored is not None else StoredLayer(store, graph, l)  # type: ignore[arg-type]
        read_seconds = time.perf_counter() - started
        started = time.perf_counter()
        plan = plan_layer(conv, old, new, applied, changed)
        whole = len(plan.targets) >= WHOLE_LAYER_FRACTION * new_graph.num_nodes
        if whole:  # most of the graph: the precompute's layer over every vertex (exact as it is)
            every = np.arange(new_graph.num_nodes, dtype=np.int64)
            h, state = whole_layer(new_graph, model, l, new_values(every))
            change = LayerChange(every, h, state, 0, len(every), new_graph.num_edges, 0)
        else:
            change = compute_layer(
                conv,
                lambda h, l=l: model.post(l - 1, h),
                plan,
                old,
                new,
                applied.old_rows,
                lambda rows, s=layer_stored: _tensor(s.values(rows, "state")),
            )
        stats = {
            "layer": l,
            "targets": len(change.targets),
            "delta": change.delta,
            "scratch": change.scratch,
            "new_messages": change.new_messages,
            "old_messages": change.old_messages,
            "seconds": round(time.perf_counter() - started, 4),
            "read_seconds": round(read_seconds, 4),
            "read": "whole" if layer_stored.rows_read is None else "rows",
            "kernel": "whole layer" if whole else "delta / scratch",
        }
        previous = RefreshedLayer(l, layer_stored, applied.old_rows, change.targets, change.h, change.state)
        yield previous, stats
        changed = change.targets


def commit_layer(writer: PEWriter, over: PEStore, layer: RefreshedLayer, ids, deleted_ids, stats: dict) -> None:
    """Commit a refreshed layer: as a delta over `over`'s layer (only the recomputed rows and the
    deleted vertices' tombstones are written), or whole when versions.should_compact says the
    chain is long or the change large."""
    l, rows = layer.layer, layer.rows
    if versions.should_compact(over.manifest, layer_key(l), len(rows) + len(deleted_ids), len(ids)):
        writer.commit_layer_arrays(l, ids, layer.full("h"), layer.full("state"))
        stats["committed"] = f"whole ({len(ids)} rows)"
        return
    h, state = layer.h.numpy(), layer.state.numpy()
    writer.commit_layer_delta(l, over, ids[rows], h, state, deleted_ids, rows=len(ids))
    stats["committed"] = f"as a delta ({len(rows)} rows, {len(deleted_ids)} tombstones)"


def carried_metrics(store: PEStore) -> tuple[list[int], int] | None:
    """(fanouts, hops) of the workload metrics (degrees, PSGS, FAP) the store version `store`
    holds, which its refreshed version recomputes on the updated graph so it keeps them (a
    serving deployment ranks its hot cache and routes by them); None when it holds none. FAP
    computed from seeds a caller gave cannot be recomputed (the seeds are not stored): None, with
    a warning, and the refreshed version has no metrics."""
    if not store.metric_tables:
        return None
    summary = (store.manifest.get("metrics") or {}).get("summary") or {}
    fanouts, hops = summary.get("fanouts"), summary.get("hops")
    if summary.get("seeds", "uniform") != "uniform" or not fanouts or hops is None:
        log.warning(
            f"sparkgnn refresh: the workload metrics of {store.base} were computed from given seeds (or "
            "their options are not recorded); the refreshed version has none: recompute them on it"
        )
        return None
    return [int(f) for f in fanouts], int(hops)


def refresh_local(
    graph,
    update,
    model,
    store_root,
    out_graph=None,
    store: PEStore | None = None,
    *,
    verify: str = "checksums",
    applied=None,
) -> tuple[PEStore, RefreshReport]:
    """Apply `update` (graph.updates.GraphUpdate) to the GraphData `graph` and to the PE store at
    `store_root` that was computed for (graph, model); commit the refreshed store as the updated
    graph's version under the same root and return it opened (verified against the updated graph)
    with a report. `out_graph`: also write the updated graph there (a graph directory). Refuses a
    store without states (a refresh starts from each vertex's stored aggregation state).
    `store`: the old version already open (its layers already loaded, e.g. by a serving process
    that refreshes in place), instead of opening and reading it again. `verify`: how the old and
    the new version's files are checked on open (PEStore.open: "checksums" reads every byte
    once; "sizes" lets a cold refresh read only the rows it needs from the row files).
    Each layer's stats name how its stored rows were read ("read": "rows" or "whole") and,
    from row files, how many (`rows_read`). `applied`: `update` already applied to `graph`
    (graph.updates.Applied; the follower's batch of several updates composed into one, pe/follow.py),
    `update` then only giving the report its counts().
    A TypedGraphData with a TypedGraphUpdate and a HeteroModel refreshes a typed store
    (pe/typed_refresh.py: returns the opened TypedPEStore; `verify`, `out_graph` and `store` as
    here, `applied` refused)."""
    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.graph.updates.typed import TypedGraphUpdate

    if isinstance(graph, TypedGraphData) or isinstance(update, TypedGraphUpdate):
        from sparkgnn.pe.typed_refresh import refresh_typed_local

        if applied is not None:
            raise RefreshError("refresh_local: `applied` is not taken for a typed graph (it applies the update itself)")
        typed_store: Any = store  # an open TypedPEStore of the typed graph, or None
        typed_result = refresh_typed_local(
            graph, update, model, store_root, out_graph=out_graph, store=typed_store, verify=verify
        )
        return typed_result  # type: ignore[return-value]
    from sparkgnn.graph.updates import apply
    from sparkgnn.models import Model
    from sparkgnn.pe.identity import graph_fingerprint

    started = time.perf_counter()
    phases: dict = {}
    clock = started

    def phase(name: str) -> None:
        """Close the phase running since the last call (its seconds go to report.phases)."""
        nonlocal clock
        now = time.perf_counter()
        phases[name] = round(phases.get(name, 0.0) + now - clock, 4)
        clock = now

    model = Model.load(model) if isinstance(model, str) else model
    require_states(model, "a PE store refresh")
    model.check_edge_attr(getattr(graph, "edge_attr_dim", 0) or None, where=f"graph {graph.name!r}")
    if store is None:
        store = PEStore.open(store_root, model=model, graph=graph, verify=verify)
    elif store.manifest.get("graph_fingerprint") != graph_fingerprint(graph):
        raise RefreshError(f"PE store {store.base} given to refresh_local is not the one of this graph")
    if not store.with_states:
        raise RefreshError(
            f"PE store {store.base} was precomputed without aggregation states; a refresh needs them "
            "(rerun the precompute with states)"
        )
    phase("open")
    if applied is None:
        applied = apply(update, graph)
    new_graph = applied.graph
    phase("apply")
    if out_graph is not None:
        from sparkgnn.graph.writer import write_graph_dir

        write_graph_dir(new_graph, out_graph)
        phase("write_graph")
    report = RefreshReport(
        store="",
        graph_fingerprint=graph_fingerprint(new_graph),
        previous_graph_fingerprint=store.manifest["graph_fingerprint"],
        updates=update.counts(),
        phases=phases,
    )
    if report.graph_fingerprint == report.previous_graph_fingerprint:
        log.info(f"sparkgnn refresh: the update leaves the graph as it was; {store.base} stays current")
        return store, report
    writer = PEWriter(store_root, new_graph, model, with_states=True)
    done = set(writer.completed_layers())
    deleted_ids = graph.ids[applied.new_rows < 0]
    if len(deleted_ids):  # an id deleted and inserted again (a batch of several updates) is no tombstone
        deleted_ids = deleted_ids[~new_graph.id_index.lookup(deleted_ids)[1]]
    phase("fingerprint")
    stored = []
    for layer, stats in refreshed_layers(graph, applied, model, store):
        stored.append(layer.stored)
        l, written = layer.layer, time.perf_counter()
        if l not in done:
            commit_layer(writer, store, layer, new_graph.ids, deleted_ids, stats)
        stats["write_seconds"] = round(time.perf_counter() - written, 4)
        report.layers.append(stats)
        log.info(
            f"sparkgnn refresh: layer {l}/{model.num_rounds}: {stats['targets']} of {new_graph.num_nodes} "
            f"vertices recomputed ({stats['delta']} by delta, {stats['scratch']} from scratch) in "
            f"{stats['seconds']:.2f} s; committed {stats.get('committed', 'earlier')}"
        )
    for stats, layer_stored in zip(report.layers, stored, strict=True):
        stats["rows_read"] = layer_stored.rows_read
    phase("layers")
    chain = list((store.manifest.get("refresh") or {}).get("chain") or [store.manifest["graph_fingerprint"]])
    report.seconds = round(time.perf_counter() - started, 3)
    writer.manifest["refresh"] = {**report.to_json(), "chain": [*chain, report.graph_fingerprint]}
    carried = carried_metrics(store)
    if carried is not None and not writer.has_metrics():
        from sparkgnn.pe.local import local_metrics

        writer.commit_metrics(local_metrics(new_graph, *carried))
        phase("metrics")
    writer.finish({"refresh_seconds": report.seconds})
    report.store = writer.base
    phase("finish")
    # the version refreshed over was checked when it was opened above (or by the caller who holds
    # it): only the new version's own files are checked again, not every base segment it lies on
    refreshed = PEStore.open(store_root, model=model, graph=new_graph, verify=verify, trusted_from=store)
    phase("verify")
    report.seconds = round(time.perf_counter() - started, 3)
    return refreshed, report
