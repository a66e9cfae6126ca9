"""Delta swaps: a worker loads the next version of a deployment by patching the rows a row-level
store version changed into the arrays of the version it serves, instead of reading the store
whole.

WHEN: the new deployment has the same model, mode options and hot-cache setting as one the
worker holds, and every layer of its PE store is committed as a delta directly over that held
version's layer (pe.versions.delta_over: what `refresh_local` and `sparkgnn-refresh follow`
commit for a small change) -- or written whole where a delta would have made the layer's chain
too long (`_chain_compacted`: its rows overwrite every held row) --, and the rows it changed
(recomputed, inserted, tombstoned) are at most DELTA_MAX_FRACTION of the new graph's vertices in
every delta layer. Anything else -- another
model, a store written whole (a large refresh, a compaction the store chose), a hot cache (its device rows are
placed by the whole store's metrics), a held version that never aligned its store (no served mode
reads it yet) -- loads whole, as before; the reason is in the warm-up reply (`loaded`).

WHAT is patched and what is rebuilt: the aligned arrays (serving.stored.StoredLayers: h^(l) and
states, rows in G's dense order) are new arrays, gathered from the held version's rows for the
vertices both graphs have and overwritten with the delta's rows, so the held version's arrays are
never written: batches still running on it (and a later swap back to it) see it unchanged. The
new graph is read from its directory -- or, when the follower published it as a delta over the
held version's graph (pe/published.py), built from that graph by applying the delta -- and gets
its own ServingContext (CSC index, statistics): its
structure changed with the update, and a context shared between versions would mix them; when the
update only inserted edges, the new context's CSC index is patched from the held one's
(ServingContext's `previous`) instead of sorting every edge again. What
is saved is the store's cost: reading every layer whole (every segment merged), checksumming every
segment, and aligning N ids per layer; the new version's own files are checksummed, its base
segments that are the held version's (checked when that version was loaded) are not listed again
(PEStore.open's `trusted_from`), any other base segment (a compacted one) is checked by size.

A patch that cannot be proven complete (a vertex of the new graph that neither the held version
nor the delta has a row for, a delta row for a vertex outside the new graph, a tombstone on a
vertex the new graph keeps) is not served: the version loads whole instead.
"""

from __future__ import annotations

import logging
import time

import numpy as np

log = logging.getLogger(__name__)

# a store version changing more than this fraction of the graph's vertices in some layer loads
# whole: its delta rows are then a large part of a whole read, and (at half the layer) the
# refresh writes the layer whole anyway (pe.versions.COMPACT_FRACTION)
DELTA_MAX_FRACTION = 0.25


class _NoDelta(Exception):
    """Why a deployment cannot be patched from the held one (loaded whole instead)."""


def patched_deployment(previous, spec: dict):
    """(the deployment `spec` patched from the held deployment `previous`, None) when `spec` is a
    small row-level successor of it (module doc), else (None, why not in one line)."""
    try:
        return _patch(previous, spec), None
    except _NoDelta as exc:
        return None, str(exc)


def _patch(previous, spec: dict):
    from sparkgnn.pe import layout, versions
    from sparkgnn.pe.published import PublishError, open_graph
    from sparkgnn.pe.store import PEStore
    from sparkgnn.serving.context import ServingContext
    from sparkgnn.serving.online.batch_op import Deployment

    started = time.perf_counter()
    old = previous.spec
    if previous.store is None or not spec.get("store"):
        raise _NoDelta("no PE store on one side")
    if (spec["model"], spec["options"], spec["cache"]) != (old["model"], old["options"], old["cache"]):
        raise _NoDelta("the model, mode options or hot cache differ from the held version's")
    if (spec.get("cache") or {}).get("policy", "off") != "off":
        raise _NoDelta("a hot cache is attached (its rows are placed from the whole store)")
    context = previous.context
    aligned = {} if context is None else context.aligned_layers()
    mine = {key: layers for key, layers in aligned.items() if key[0] == previous.store.base}
    if not mine:
        raise _NoDelta("the held version has no aligned store to patch (no stored mode served yet)")
    model = previous.model
    k = model.num_rounds
    try:  # a published delta (pe/published.py) applies to the held version's graph
        graph = open_graph(spec["graph"], held=previous.graph)
    except PublishError as exc:
        raise _NoDelta(f"its graph does not open: {exc}") from exc
    try:
        store = PEStore.open(spec["store"], model=model, graph=graph, verify="sizes", trusted_from=previous.store)
    except Exception as exc:  # noqa: BLE001 - the whole load names the problem in its own words
        raise _NoDelta(f"its store does not open ({type(exc).__name__})") from exc
    if store.base == previous.store.base:
        raise _NoDelta("the same store version")
    if versions.version_dir(store.base, str(previous.store.manifest["graph_fingerprint"])) != previous.store.base:
        raise _NoDelta("its store lies under another root than the held version's")
    keys = [layout.layer_key(l) for l in range(1, k + 1)]
    compacted = {key for key in keys if _chain_compacted(previous.store.manifest, store.manifest, key)}
    if not all(key in compacted or versions.delta_over(previous.store.manifest, store.manifest, key) for key in keys):
        raise _NoDelta("its store is not a row-level delta over the held version's")
    damage = _own_damage(store, keys)
    if damage:
        raise _NoDelta(f"its own files fail their checksums ({damage})")
    states = any(key[2] for key in mine)
    columns = ("state",) if states else ()
    limit = DELTA_MAX_FRACTION * max(graph.num_nodes, 1)
    deltas = {}
    for l in range(1, k):
        table = versions.own_rows(store.base, store.manifest, layout.layer_key(l), columns)
        if table.num_rows > limit and layout.layer_key(l) not in compacted:
            raise _NoDelta(
                f"layer {l} changed {table.num_rows} rows, over {DELTA_MAX_FRACTION:g} of {graph.num_nodes} vertices"
            )
        deltas[l] = table
    new_context = ServingContext(graph, model, store=store, validate=context.validate, previous=context)
    old_pos, in_old = previous.graph.id_index.lookup(graph.ids)
    patched_rows = 0
    for (_base, _fp, with_states), layers in mine.items():
        h, state = {}, {}
        for l, table in deltas.items():
            rows, values = _delta_rows(graph, table, store, l, with_states)
            covered = in_old.copy()
            covered[rows] = True
            if not covered.all():
                raise _NoDelta(f"layer {l}: {int((~covered).sum())} vertices have no row in either version")
            h[l] = _patched(layers.h[l], old_pos, in_old, rows, values["h"])
            if with_states:
                state[l] = _patched(layers.state[l], old_pos, in_old, rows, values["state"])
            patched_rows = max(patched_rows, len(rows))
        from sparkgnn.serving.stored import StoredLayers

        new_context.adopt_stored_layers(
            store, model, with_states, StoredLayers.from_arrays(graph, model, h, state if with_states else None)
        )
    dep = Deployment(spec, parts={"graph": graph, "model": model, "store": store, "context": new_context})
    dep.loaded = {
        "how": "delta",
        "seconds": round(time.perf_counter() - started, 4),
        "rows_patched": patched_rows,
        "from": previous.store.base,
    }
    log.info(f"delta swap: {store.base} patched over {previous.store.base} ({dep.loaded['seconds']} s)")
    return dep


def _chain_compacted(previous: dict, manifest: dict, key: str) -> bool:
    """Whether `manifest` writes layer `key` whole only because a delta over `previous`'s layer
    would have made its chain too long (pe.versions.should_compact's first reason: what the
    follower does about every MAX_SEGMENTS versions, however small the change). Its own rows are
    then every row of the layer, which the patch lays over the held arrays like a delta's (every
    row overwritten); a layer written whole for a large change still loads whole."""
    from sparkgnn.pe import versions

    refresh = manifest.get("refresh") or {}
    return (
        not versions.bases(manifest, key)
        and refresh.get("previous_graph_fingerprint") == previous.get("graph_fingerprint")
        and len(versions.bases(previous, key)) + 2 > versions.MAX_SEGMENTS
    )


def _own_damage(store, keys: list[str]) -> str:
    """Why the new version's own committed files (its layers' delta attempts, its metrics tables)
    are not the ones recorded, '' when they are."""
    from sparkgnn.pe import integrity, layout, rowfile
    from sparkgnn.pe.rowfile import ROW_FILES_KEY

    manifest = store.manifest
    recorded = manifest.get(integrity.FILES_KEY) or {}
    row_files = manifest.get(ROW_FILES_KEY) or {}
    found = []
    for key in [*keys, *(layout.metrics_key(n) for n in store.metric_tables)]:
        folder = layout.committed_dir(store.base, manifest, key)
        problems = integrity.problems(folder, recorded.get(key), "checksums")
        problems += rowfile.problems(folder, row_files.get(key), "checksums")
        if problems:
            found.append(f"{key}: " + ", ".join(problems))
    return "; ".join(found)


def _delta_rows(graph, table, store, layer: int, with_states: bool) -> tuple[np.ndarray, dict]:
    """(dense rows of the new graph, {"h": [n, w], "state": [n, s]}) of the delta's live rows;
    refuses (_NoDelta) a live row outside the graph or a tombstone on a vertex it keeps."""
    from sparkgnn.pe.lookup import vectors

    ids = table.column("id").to_numpy().astype(np.int64, copy=False)
    alive = table.column("h").is_valid().to_numpy(zero_copy_only=False)
    if (~alive).any() and graph.id_index.lookup(ids[~alive])[1].any():
        raise _NoDelta(f"layer {layer}: a tombstone names a vertex the new graph keeps")
    rows, in_graph = graph.id_index.lookup(ids[alive])
    if not in_graph.all():
        raise _NoDelta(f"layer {layer}: {int((~in_graph).sum())} delta rows name vertices outside the new graph")
    live = table.filter(alive) if not alive.all() else table
    what = f"PE store layer {layer} delta"
    values = {"h": vectors(live.column("h"), store.width(layer), f"{what} h")}
    if with_states:
        values["state"] = vectors(live.column("state"), store.state_width(layer), f"{what} state")
    return np.asarray(rows, np.int64), values


def _patched(old: np.ndarray, old_pos: np.ndarray, in_old: np.ndarray, rows: np.ndarray, values) -> np.ndarray:
    """A new array in the new graph's row order: the held version's row for every vertex both
    graphs have, then the delta's rows laid over it (`old` itself is never written)."""
    out = np.empty((len(in_old), old.shape[1]), old.dtype)
    if in_old.all():
        np.take(old, old_pos, axis=0, out=out)
    else:
        out[in_old] = old[old_pos[in_old]]
    out[rows] = values
    return out
