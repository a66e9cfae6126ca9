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

This path holds every layer of the old store in memory (like precompute_local). For stores that
do not fit one machine, engine/refresh runs the same kernel on pieces of the graph in Spark
tasks and commits the same versions.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.pe import versions
from sparkgnn.pe.lookup import SortedTable
from sparkgnn.pe.refresh_kernel import Side, refresh_layer
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter, layer_key

log = logging.getLogger(__name__)


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


@dataclass
class RefreshedLayer:
    """Layer l of the updated graph as a refresh knows it: the stored rows of the old version
    (`table`, `stored_pos`: old row -> table row) with the recomputed `rows` (sorted new-graph
    rows) replaced by `h` and `state`. WHY not one full array: gathering every stored row into
    new-graph order costs O(N) copies per layer, as much as a small update's whole computation;
    only a layer written whole (compaction) needs them (`full`)."""

    layer: int
    table: SortedTable
    stored_pos: np.ndarray
    old_rows: np.ndarray
    rows: np.ndarray
    h: torch.Tensor
    state: torch.Tensor

    def old_values(self, rows: np.ndarray) -> torch.Tensor:
        """Stored h^(l) of old-graph rows."""
        return _tensor(self.table.columns["h"][self.stored_pos[rows]])

    def new_values(self, rows: np.ndarray) -> torch.Tensor:
        """h^(l) of new-graph rows: recomputed where the refresh recomputed them, else stored."""
        rows = np.asarray(rows, np.int64)
        at = np.minimum(np.searchsorted(self.rows, rows), max(len(self.rows) - 1, 0))
        fresh = (self.rows[at] == rows) if len(self.rows) else np.zeros(len(rows), bool)
        out = torch.empty(len(rows), self.h.shape[1])
        out[torch.from_numpy(fresh)] = self.h[torch.from_numpy(at[fresh])]
        kept = ~fresh
        out[torch.from_numpy(kept)] = self.old_values(self.old_rows[rows[kept]])
        return out

    def full(self, column: str) -> np.ndarray:
        """The whole column in new-graph row order."""
        fresh = self.h if column == "h" else self.state
        out = np.empty((len(self.old_rows), fresh.shape[1]), np.float32)
        kept = np.flatnonzero(self.old_rows >= 0)
        out[kept] = self.table.columns[column][self.stored_pos[self.old_rows[kept]]]
        out[self.rows] = fresh.numpy()
        return out


def _stored(store: PEStore, graph, layer: int) -> tuple[SortedTable, np.ndarray]:
    """The old version's layer table and, per old-graph row, its row in that table."""
    from sparkgnn.pe.lookup import UnknownIds

    table = store.table(layer)
    if "state" not in table.columns:
        raise RefreshError(f"PE store {store.base} layer {layer} has no stored states")
    try:
        return table, table.positions(graph.ids)
    except UnknownIds as exc:
        raise RefreshError(f"PE store {store.base} layer {layer} lacks vertices of the graph: {exc}") from exc


@torch.no_grad()
def refreshed_layers(graph, applied, model, store: PEStore):
    """Yield (RefreshedLayer, stats dict) of the updated graph for l = 1..k, recomputing only
    what the update reaches (the rows recomputed include every inserted vertex)."""
    new_graph = applied.graph
    changed = np.asarray(applied.feature_changed, np.int64)
    previous: RefreshedLayer | None = None
    for l, conv in enumerate(model.convs, start=1):
        if previous is None:
            old_values = lambda rows: model.pre(_tensor(graph.x[rows]))  # noqa: E731
            new_values = lambda rows: model.pre(_tensor(new_graph.x[rows]))  # noqa: E731
        else:
            old_values, new_values = previous.old_values, previous.new_values
        old = Side.of(conv, graph, old_values)
        new = Side.of(conv, new_graph, new_values)
        started = time.perf_counter()
        table, stored_pos = _stored(store, graph, l)
        read_seconds = time.perf_counter() - started
        started = time.perf_counter()
        change = refresh_layer(
            conv,
            lambda h, l=l: model.post(l - 1, h),
            old,
            new,
            applied,
            changed,
            lambda rows, t=table, p=stored_pos: _tensor(t.columns["state"][p[rows]]),
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
        }
        previous = RefreshedLayer(l, table, stored_pos, applied.old_rows, change.targets, change.h, change.state)
        yield previous, stats
        changed = change.targets


def _commit(writer: PEWriter, over: PEStore, layer: RefreshedLayer, ids, deleted_ids, stats: dict) -> None:
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


def refresh_local(
    graph, update, model, store_root, out_graph=None, store: PEStore | None = None
) -> tuple[PEStore, RefreshReport]:
    """Apply `update` (graph.updates.GraphUpdate) to the GraphData `graph` and to the PE store at
    `store_root` that was computed for (graph, model); commit the refreshed store as the updated
    graph's version under the same root and return it opened (verified against the updated graph)
    with a report. `out_graph`: also write the updated graph there (a graph directory). Refuses a
    store without states (a refresh starts from each vertex's stored aggregation state).
    `store`: the old version already open (its layers already loaded, e.g. by a serving process
    that refreshes in place), instead of opening and reading it again."""
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
    if store is None:
        store = PEStore.open(store_root, model=model, graph=graph)
    elif store.manifest.get("graph_fingerprint") != graph_fingerprint(graph):
        raise RefreshError(f"PE store {store.base} given to refresh_local is not the one of this graph")
    if not store.with_states:
        raise RefreshError(
            f"PE store {store.base} was precomputed without aggregation states; a refresh needs them "
            "(rerun the precompute with states)"
        )
    phase("open")
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
    phase("fingerprint")
    for layer, stats in refreshed_layers(graph, applied, model, store):
        l, written = layer.layer, time.perf_counter()
        if l not in done:
            _commit(writer, store, layer, new_graph.ids, deleted_ids, stats)
        stats["write_seconds"] = round(time.perf_counter() - written, 4)
        report.layers.append(stats)
        log.info(
            f"sparkgnn refresh: layer {l}/{model.num_rounds}: {stats['targets']} of {new_graph.num_nodes} "
            f"vertices recomputed ({stats['delta']} by delta, {stats['scratch']} from scratch) in "
            f"{stats['seconds']:.2f} s; committed {stats.get('committed', 'earlier')}"
        )
    phase("layers")
    chain = list((store.manifest.get("refresh") or {}).get("chain") or [store.manifest["graph_fingerprint"]])
    report.seconds = round(time.perf_counter() - started, 3)
    writer.manifest["refresh"] = {**report.to_json(), "chain": [*chain, report.graph_fingerprint]}
    writer.finish({"refresh_seconds": report.seconds})
    report.store = writer.base
    phase("finish")
    refreshed = PEStore.open(store_root, model=model, graph=new_graph)
    phase("verify")
    report.seconds = round(time.perf_counter() - started, 3)
    return refreshed, report
