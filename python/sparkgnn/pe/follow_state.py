"""What a refresh follower (pe/follow.py) carries in memory from one batch to the next.

Three pieces of state, each kept from a batch's change alone so that a small batch costs
O(change), not a pass over the whole graph or store:

- `compose`: the Applied of two updates applied one after the other, as one (G0 -> G2). WHY: an
  update is a set (its deletes before its inserts), so the files of a batch cannot be merged into
  one update; each is applied in order and their row and edge mappings composed into the one
  Applied the refresh kernel takes.
- `LiveLayer`: a layer's rows recomputed since the last committed store version, held by vertex
  id over that version's rows. WHY: a store version per batch costs far more than the refresh of
  a small batch; held here, the rows are current at once and reach the disk as one version per
  commit.
- `RunningFingerprint`: the graph fingerprint advanced by the hashes of the rows a batch removes
  and adds. WHY: hashing the whole graph again each batch costs more than a small refresh.

`AtGraph` reads a LiveLayer by the rows of one graph version (what the refresh kernel and a
commit read the old version's layer through). `FollowError` lives here because a live layer
refuses a store it cannot follow; the follower raises it too.
"""

from __future__ import annotations

import copy

import numpy as np

from sparkgnn import npsets
from sparkgnn.errors import SparkGNNError


class FollowError(SparkGNNError, ValueError):
    """A follower that cannot start or go on: a state folder of another graph or store, a log
    that no longer replays to its checkpoint."""


def compose(first, second, old_x: np.ndarray):
    """The Applied of `first` (G0 -> G1) followed by `second` (G1 -> G2): G0 -> G2, in the layout
    the refresh kernel expects (kept G0 edges first, in G0 order, then every other edge of G2).
    `old_x`: G0's features (a row changed by either step counts as changed only if its G2
    features differ from them: a later file may set a value back)."""
    from sparkgnn.graph.updates import Applied

    def through(mapping: np.ndarray, then: np.ndarray) -> np.ndarray:
        return np.where(mapping >= 0, then[np.maximum(mapping, 0)], -1) if len(then) else np.full_like(mapping, -1)

    g0_edges = len(first.kept_edges) + len(first.removed_edges)
    from_g0 = second.kept_edges[second.kept_edges < len(first.kept_edges)]  # a prefix of G2's edges
    kept = first.kept_edges[from_g0]
    removed = np.ones(g0_edges, bool)
    removed[kept] = False
    old_rows = through(second.old_rows, first.old_rows)
    new_rows = through(first.new_rows, second.new_rows)
    g2 = second.graph
    candidates = npsets.union(second.feature_changed, through(first.feature_changed, second.new_rows))
    candidates = candidates[(candidates >= 0) & (old_rows[np.maximum(candidates, 0)] >= 0)]
    if len(candidates):
        candidates = candidates[np.any(g2.x[candidates] != old_x[old_rows[candidates]], axis=1)]
    inserted_rows = np.flatnonzero(old_rows < 0)
    return Applied(
        graph=g2,
        old_rows=old_rows,
        new_rows=new_rows,
        removed_edges=np.flatnonzero(removed),
        kept_edges=kept,
        inserted_edges=np.arange(len(kept), g2.num_edges),
        feature_changed=npsets.union(candidates, inserted_rows).astype(np.int64),
    )


class LiveLayer:
    """Layer l as of the follower's current graph: the rows recomputed since the last committed
    store version, held in memory by vertex id, over that version's rows (read by id from its row
    files, or from the layer held whole when it has none).

    WHY: committing a store version per batch (a writer attempt, Parquet and row files, fsyncs,
    a manifest, every 8th version a whole layer) costs far more than the refresh of a small batch;
    held here, a batch's rows are current at once and reach the disk as ONE row-level version per
    commit (RefreshFollower.commit), however many batches it covers."""

    def __init__(self, store, layer: int):
        self.layer = int(layer)
        self.what = f"PE store {store.base} layer {layer}"
        self.rows = store.rows(layer) if not store.loaded(layer) else None
        self.table = None
        if self.rows is None:
            self.table = store.table(layer)
            columns = self.table.columns
        else:
            columns = self.rows.columns
        if "state" not in columns:
            raise FollowError(f"{self.what} has no stored states")
        self.ids = np.zeros(0, np.int64)  # sorted ids recomputed since the commit
        self._slots = np.zeros(0, np.int64)  # slot in the buffers of each of `ids`
        self._used = 0  # buffer slots taken (a replaced or deleted row's slot is not reused)
        self._buffers = {  # "h" / "state" -> float32 [capacity, w], grown by doubling
            "h": np.zeros((0, store.width(layer)), np.float32),
            "state": np.zeros((0, store.state_width(layer) or 0), np.float32),
        }
        self._generation = 0  # bumped by snapshot(): the rows held since are the next commit's
        self._slot_generation = np.zeros(0, np.int64)  # per buffer slot: the generation that last wrote it

    @property
    def values_of(self) -> dict[str, np.ndarray]:
        """The held rows in `ids` order (a copy): column name (h, state) -> float32 [len(ids), w]."""
        return {column: buffer[self._slots] for column, buffer in self._buffers.items()}

    def read(self, ids: np.ndarray, column: str) -> np.ndarray:
        """`column` of `ids` (float32 [n, w]): the held row where there is one, else the committed one."""
        ids = np.asarray(ids, np.int64)
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        held = (self.ids[at] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        buffer = self._buffers[column]
        if held.all() and len(ids):
            return buffer[self._slots[at]]
        committed = self._committed(ids[~held], column)
        out = np.empty((len(ids), committed.shape[1]), np.float32)
        out[~held] = committed
        if held.any():
            out[held] = buffer[self._slots[at[held]]]
        return out

    def _committed(self, ids: np.ndarray, column: str) -> np.ndarray:
        from sparkgnn.pe.lookup import UnknownIds

        try:
            if self.rows is not None:
                return self.rows.get(ids, column)
            assert self.table is not None  # __init__ sets one of rows and table
            return self.table.columns[column][self.table.positions(ids)]
        except UnknownIds as exc:
            raise FollowError(f"{self.what} lacks vertices of the followed graph: {exc}") from exc

    def hold(self, ids: np.ndarray, h: np.ndarray, state: np.ndarray, deleted_ids: np.ndarray) -> None:
        """Hold the recomputed rows of `ids` (replacing older ones) and drop `deleted_ids`.

        WHY patched, not rebuilt: the rows held grow with every batch until the next commit, and
        copying all of them per batch would cost O(held) values; the values of a held id are
        overwritten in its slot, new ones appended (buffers grown by doubling), and only the
        sorted id and slot arrays (8 bytes a row each) are merged."""
        ids = np.asarray(ids, np.int64)
        fresh = {"h": np.asarray(h, np.float32), "state": np.asarray(state, np.float32)}
        deleted = np.asarray(deleted_ids, np.int64)
        if len(deleted) and len(self.ids):
            keep = ~np.isin(self.ids, deleted)
            self.ids, self._slots = self.ids[keep], self._slots[keep]
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        held = (self.ids[at] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        slots = np.empty(len(ids), np.int64)
        slots[held] = self._slots[at[held]]
        new = np.flatnonzero(~held)
        slots[new] = self._used + np.arange(len(new))
        self._reserve(self._used + len(new))
        self._used += len(new)
        for column, buffer in self._buffers.items():
            buffer[slots] = fresh[column]
        self._slot_generation[slots] = self._generation
        if len(new):
            merged = np.concatenate([self.ids, ids[new]])
            order = np.argsort(merged, kind="stable")
            self.ids, self._slots = merged[order], np.concatenate([self._slots, slots[new]])[order]

    def _reserve(self, rows: int) -> None:
        """Grow the buffers (doubling) to hold at least `rows` slots."""
        capacity = len(self._buffers["h"])
        if rows <= capacity:
            return
        capacity = max(rows, 2 * capacity, 256)
        for column, buffer in self._buffers.items():
            grown = np.empty((capacity, buffer.shape[1]), np.float32)
            grown[: self._used] = buffer[: self._used]
            self._buffers[column] = grown
        generation = np.zeros(capacity, np.int64)
        generation[: self._used] = self._slot_generation[: self._used]
        self._slot_generation = generation

    def snapshot(self) -> LiveLayer:
        """A frozen copy of this layer as it is now (the rows held, over the same committed rows),
        which a commit writes on another thread while later batches hold more rows here; the rows
        held from now on are told apart from those the snapshot has (`rebased`)."""
        frozen = copy.copy(self)
        frozen.ids = self.ids.copy()
        frozen._slots = np.arange(len(self.ids))
        frozen._buffers = self.values_of
        frozen._used = len(self.ids)
        frozen._slot_generation = np.zeros(len(self.ids), np.int64)
        self._generation += 1
        return frozen

    def rebased(self, store) -> LiveLayer:
        """This layer over `store` (the version committed from the last `snapshot`): a new
        LiveLayer holding only the rows held since that snapshot; the ones before it are the
        store's now."""
        fresh = LiveLayer(store, self.layer)
        since = self._slot_generation[self._slots] == self._generation
        if since.any():
            values = {column: buffer[self._slots[since]] for column, buffer in self._buffers.items()}
            fresh.hold(self.ids[since], values["h"], values["state"], np.zeros(0, np.int64))
        return fresh

    @property
    def rows_read(self) -> int | None:
        """Committed rows fetched from the row files so far (None: the layer is held whole)."""
        return None if self.rows is None else self.rows.rows_read


class AtGraph:
    """A LiveLayer read by row of one graph version (what refresh.refreshed_layers reads the old
    version's layer through)."""

    def __init__(self, live: LiveLayer, graph):
        self.live, self.ids = live, graph.ids

    def values(self, rows: np.ndarray, column: str) -> np.ndarray:
        return self.live.read(self.ids[rows], column)

    @property
    def rows_read(self) -> int | None:
        return self.live.rows_read


class RunningFingerprint:
    """The graph fingerprint (graph/fingerprint.py) kept up to date across batches from the change
    alone. WHY: the fingerprint is a sum of per-vertex and per-edge row hashes, so a batch changes
    it by the hashes of the rows it removes and adds; hashing the whole graph again costs a pass
    over every feature and edge per batch, more than the refresh of a small batch. One full pass
    at start (`of`), then `advance` per batch; graphs with edge attributes are hashed whole."""

    def __init__(self, graph, vertex_sum: int, edge_sum: int):
        self.graph, self.vertex_sum, self.edge_sum = graph, vertex_sum, edge_sum

    @classmethod
    def of(cls, graph) -> RunningFingerprint:
        from sparkgnn.graph.fingerprint import edge_hash_sum, vertex_hash_sum

        return cls(
            graph, vertex_hash_sum(graph.ids, graph.x), edge_hash_sum(graph.src_ids, graph.dst_ids, graph.weight)
        )

    def advance(self, applied) -> RunningFingerprint:
        """The fingerprint of `applied.graph` (`applied`: this graph to the next, one update or
        several composed), primed into the new graph's cached `fingerprint`."""
        from sparkgnn.graph.fingerprint import FingerprintAccumulator, edge_hash_sum, vertex_hash_sum

        old, new, mask = self.graph, applied.graph, (1 << 64) - 1
        if old.edge_attr is not None or new.edge_attr is not None:
            return RunningFingerprint.of(new)
        changed = np.asarray(applied.feature_changed, np.int64)  # new rows: inserted or new features
        kept_changed = applied.old_rows[changed]
        gone = npsets.union(np.flatnonzero(applied.new_rows < 0), kept_changed[kept_changed >= 0])
        vertex_sum = self.vertex_sum - vertex_hash_sum(old.ids[gone], old.x[gone])
        vertex_sum += vertex_hash_sum(new.ids[changed], new.x[changed])
        removed, inserted = applied.removed_edges, applied.inserted_edges
        edge_sum = self.edge_sum - edge_hash_sum(
            old.ids[old.edge_src[removed]], old.ids[old.edge_dst[removed]], _take(old.weight, removed)
        )
        edge_sum += edge_hash_sum(
            new.ids[new.edge_src[inserted]], new.ids[new.edge_dst[inserted]], _take(new.weight, inserted)
        )
        acc = FingerprintAccumulator(new.feature_dim, new.weight is not None)
        acc.add_partial(new.num_nodes, vertex_sum & mask, new.num_edges, edge_sum & mask)
        new.__dict__["fingerprint"] = acc.hexdigest()  # GraphData.fingerprint is a cached_property
        return RunningFingerprint(new, vertex_sum & mask, edge_sum & mask)


def _take(values: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return None if values is None else values[rows]
