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

This path holds every layer of the old store in memory (like precompute_local). A Spark job for
stores that do not fit one machine is not built yet (docs/ARCHITECTURE.md, "Incremental PE
refresh", says what it needs).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from sparkgnn.errors import SparkGNNError
from sparkgnn.pe import versions
from sparkgnn.pe.refresh_kernel import Side, refresh_layer
from sparkgnn.pe.store import PEStore
from sparkgnn.pe.writer import PEWriter, layer_key


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
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.require(a, np.float32, ["C", "W"]))


def _values(model, graph, layer: int, h_full):
    """h^(layer) of rows: pre(x) at layer 0 (node-wise, so computed per row), else the full
    array."""
    if layer == 0:
        return lambda rows: model.pre(_tensor(graph.x[rows]))
    return lambda rows: h_full[torch.from_numpy(np.asarray(rows, np.int64))]


@torch.no_grad()
def refreshed_layers(graph, applied, model, store: PEStore):
    """Yield (l, h^(l) [N', w], state^(l) [N', s], recomputed rows, stats dict) of the updated
    graph for l = 1..k, recomputing only what the update reaches (the rows recomputed, sorted
    new-graph rows, include every inserted vertex)."""
    from sparkgnn.pe.lookup import UnknownIds

    new_graph = applied.graph
    old_rows = applied.old_rows
    kept = np.flatnonzero(old_rows >= 0)
    changed = np.asarray(applied.feature_changed, np.int64)
    old_h = new_h = None
    for l, conv in enumerate(model.convs, start=1):
        old = Side.of(conv, graph, _values(model, graph, l - 1, old_h))
        new = Side.of(conv, new_graph, _values(model, new_graph, l - 1, new_h))
        try:
            stored_h, stored_state = store.lookup(graph.ids, l, states=True)
        except UnknownIds as exc:
            raise RefreshError(f"PE store {store.base} layer {l} lacks vertices of the graph: {exc}") from exc
        stored_h, stored_state = _tensor(stored_h), _tensor(stored_state)
        started = time.perf_counter()
        change = refresh_layer(
            conv,
            lambda h, l=l: model.post(l - 1, h),
            old,
            new,
            applied,
            changed,
            lambda rows, s=stored_state: s[torch.from_numpy(rows)],
        )
        h = torch.empty(len(old_rows), stored_h.shape[1])
        state = torch.empty(len(old_rows), stored_state.shape[1])
        h[torch.from_numpy(kept)] = stored_h[torch.from_numpy(old_rows[kept])]
        state[torch.from_numpy(kept)] = stored_state[torch.from_numpy(old_rows[kept])]
        rows = torch.from_numpy(change.targets)
        h[rows], state[rows] = change.h, change.state
        stats = {
            "layer": l,
            "targets": len(change.targets),
            "delta": change.delta,
            "scratch": change.scratch,
            "new_messages": change.new_messages,
            "old_messages": change.old_messages,
            "seconds": round(time.perf_counter() - started, 4),
        }
        yield l, h, state, change.targets, stats
        changed = change.targets
        old_h, new_h = stored_h, h


def _commit(writer: PEWriter, over: PEStore, l: int, ids, h, state, rows, deleted_ids, stats: dict) -> None:
    """Commit layer l of the refreshed store: as a delta over `over`'s layer (only the recomputed
    rows and the deleted vertices' tombstones are written), or whole when versions.should_compact
    says the chain is long or the change large."""
    changed = len(rows) + len(deleted_ids)
    if versions.should_compact(over.manifest, layer_key(l), changed, len(ids)):
        writer.commit_layer_arrays(l, ids, h, state)
        stats["committed"] = f"whole ({len(ids)} rows)"
        return
    writer.commit_layer_delta(l, over, ids[rows], h[rows], state[rows], deleted_ids, rows=len(ids))
    stats["committed"] = f"as a delta ({len(rows)} rows, {len(deleted_ids)} tombstones)"


def refresh_local(graph, update, model, store_root, out_graph=None, log=print) -> tuple[PEStore, RefreshReport]:
    """Apply `update` (graph.updates.GraphUpdate) to the GraphData `graph` and to the PE store at
    `store_root` that was computed for (graph, model); commit the refreshed store as the updated
    graph's version under the same root and return it opened (verified against the updated graph)
    with a report. `out_graph`: also write the updated graph there (a graph directory). Refuses a
    store without states (a refresh starts from each vertex's stored aggregation state)."""
    from sparkgnn.graph.updates import apply
    from sparkgnn.models import Model
    from sparkgnn.pe.identity import graph_fingerprint

    started = time.perf_counter()
    model = Model.load(model) if isinstance(model, str) else model
    store = PEStore.open(store_root, model=model, graph=graph)
    if not store.with_states:
        raise RefreshError(
            f"PE store {store.base} was precomputed without aggregation states; a refresh needs them "
            "(rerun the precompute with states)"
        )
    applied = apply(update, graph)
    new_graph = applied.graph
    if out_graph is not None:
        from sparkgnn.graph.writer import write_graph_dir

        write_graph_dir(new_graph, out_graph)
    report = RefreshReport(
        store="",
        graph_fingerprint=graph_fingerprint(new_graph),
        previous_graph_fingerprint=store.manifest["graph_fingerprint"],
        updates=update.counts(),
    )
    if report.graph_fingerprint == report.previous_graph_fingerprint:
        log and log(f"sparkgnn refresh: the update leaves the graph as it was; {store.base} stays current")
        return store, report
    writer = PEWriter(store_root, new_graph, model, with_states=True, log=log)
    done = set(writer.completed_layers())
    deleted_ids = graph.ids[applied.new_rows < 0]
    for l, h, state, rows, stats in refreshed_layers(graph, applied, model, store):
        written = time.perf_counter()
        if l not in done:
            _commit(writer, store, l, new_graph.ids, h.numpy(), state.numpy(), rows, deleted_ids, stats)
        stats["write_seconds"] = round(time.perf_counter() - written, 4)
        report.layers.append(stats)
        if log:
            log(
                f"sparkgnn refresh: layer {l}/{model.num_layers}: {stats['targets']} of {new_graph.num_nodes} "
                f"vertices recomputed ({stats['delta']} by delta, {stats['scratch']} from scratch) in "
                f"{stats['seconds']:.2f} s; committed {stats.get('committed', 'earlier')}"
            )
    report.seconds = round(time.perf_counter() - started, 3)
    chain = list((store.manifest.get("refresh") or {}).get("chain") or [store.manifest["graph_fingerprint"]])
    writer.manifest["refresh"] = {**report.to_json(), "chain": [*chain, report.graph_fingerprint]}
    writer.finish({"refresh_seconds": report.seconds})
    report.store = writer.base
    return PEStore.open(store_root, model=model, graph=new_graph), report
