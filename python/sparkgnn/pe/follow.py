"""RefreshFollower: keep a PE store fresh under a stream of graph updates (`sparkgnn-refresh follow`).

A long-running process that holds the current graph and store version, watches a folder of update
files (graph.updates Parquet, one per change set, the way the streaming job watches request
files), coalesces what arrived into batches -- closed when they hold `max_batch_updates` update
rows or their oldest file has waited `max_latency_s`, whichever comes first -- applies each batch
with the incremental refresh (pe/refresh.py: the delta / scratch kernel, reading only the rows it
needs from the row files) and commits it as a row-level store version (pe/versions.py).

WHY files of a batch are applied one after another and composed, not merged into one update: an
update is a set (its deletes apply before its inserts), so two files merged into one would not
mean what the two did in order (a file inserting an edge and a later one deleting it). Each file
is applied in arrival order (graph.updates.apply) and the row and edge mappings are composed
(`compose`) into the one Applied the kernel takes: the old version's graph to the batch's last.

Exactly once, by a checkpoint written atomically in the state folder:

    <state>/checkpoint.json     batches done, the current graph fingerprint and store version, every
                                file consumed (applied or dead-lettered), and the batch in flight
    <state>/log/<batch>/<file>  the bytes of every file of a batch, copied before it is applied
    <state>/dead/               malformed files and files the graph refuses (streaming.DeadLetter)

A batch is first logged (its files copied, the checkpoint naming it `pending`), then refreshed,
then committed (the checkpoint naming it done and its files consumed). A follower killed at any
point restarts from the base graph, replays the logged batches in memory (graph.updates.apply,
no refresh: their versions are committed), checks that it reached the checkpoint's graph
fingerprint, and redoes a pending batch from its log -- the refresh of a version already
(partly) committed commits only its missing layers -- so no file is applied twice or lost. A
malformed file, or one that does not apply to the graph as of its turn, is dead-lettered with
the reason and the stream moves on.

Each batch logs one line (files, update rows, vertices recomputed per layer, batch latency from
its oldest file's arrival to the commit, updates/s) and keeps it in `history`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from sparkgnn import files
from sparkgnn.errors import SparkGNNError

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
LOG_DIR = "log"
DEAD_DIR = "dead"
FORMAT = 1


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
    candidates = np.union1d(second.feature_changed, through(first.feature_changed, second.new_rows))
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
        feature_changed=np.union1d(candidates, inserted_rows).astype(np.int64),
    )


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
        gone = np.union1d(np.flatnonzero(applied.new_rows < 0), kept_changed[kept_changed >= 0])
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


@dataclass
class BatchCounts:
    """The update files of one batch, in arrival order: what counts() sums for the report."""

    counts_by_file: list[dict] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.counts_by_file:
            for k, v in c.items():
                out[k] = out.get(k, 0) + int(v)
        return out


@dataclass
class FollowProgress:
    """One committed batch: files applied and dead-lettered, update rows, vertices recomputed
    per layer, seconds of the refresh, latency from the oldest file's arrival to the commit."""

    batch: int
    files: int
    dead_letters: int
    updates: int
    recomputed: list
    seconds: float
    latency_s: float
    graph_fingerprint: str

    def line(self) -> str:
        rate = self.updates / self.seconds if self.seconds > 0 else 0.0
        per_layer = ", ".join(f"L{i + 1} {n}" for i, n in enumerate(self.recomputed)) or "nothing"
        return (
            f"refresh follow: batch {self.batch}: {self.updates} updates from {self.files} files, "
            f"{self.dead_letters} dead-lettered; recomputed {per_layer}; refresh {self.seconds:.3f}s "
            f"({rate:.0f} updates/s), latency {self.latency_s:.3f}s; version {self.graph_fingerprint[:12]}"
        )


class RefreshFollower:
    """Follow the update files in `updates`, keeping the PE store under `store` fresh (module doc).

    `graph`: the GraphData or graph directory the follow started from (the store holds its
    version); `model`: a Model or saved-model path; `state`: the checkpoint folder (created; a
    follower restarted on the same folder resumes). `max_batch_updates` and `max_latency_s`
    close a batch (update rows, seconds the oldest file waited); `poll_s`: how often the folder
    is listed; `verify`: how store versions are checked on open (PEStore.open)."""

    def __init__(
        self,
        *,
        graph,
        model,
        store: str,
        updates: str,
        state: str,
        max_batch_updates: int = 10_000,
        max_latency_s: float = 0.2,
        poll_s: float = 0.05,
        verify: str = "sizes",
    ):
        from sparkgnn.deadletter import DeadLetter
        from sparkgnn.graph.reader import read_graph_dir
        from sparkgnn.models import Model
        from sparkgnn.pe.store import PEStore

        if max_batch_updates < 1 or max_latency_s < 0 or poll_s <= 0:
            raise ValueError(
                f"max_batch_updates must be >= 1, max_latency_s >= 0 and poll_s > 0; got "
                f"{max_batch_updates}, {max_latency_s}, {poll_s}"
            )
        self.model = Model.load(model) if isinstance(model, (str, os.PathLike)) else model
        self.graph = read_graph_dir(str(graph)) if isinstance(graph, (str, os.PathLike)) else graph
        self.store_root = str(store)
        self.updates = os.path.abspath(updates)
        self.state = os.path.abspath(state)
        self.max_batch_updates = int(max_batch_updates)
        self.max_latency_s = float(max_latency_s)
        self.poll_s = float(poll_s)
        self.verify = verify
        self.history: list[FollowProgress] = []
        self._stop = False
        os.makedirs(os.path.join(self.state, LOG_DIR), exist_ok=True)
        self.dead = DeadLetter(os.path.join(self.state, DEAD_DIR))
        base_fp = self.graph.fingerprint
        self.checkpoint = self._read_checkpoint() or {
            "format": FORMAT,
            "base_graph_fingerprint": base_fp,
            "store": self.store_root,
            "batches": [],
            "dead": [],
            "pending": None,
        }
        started_from = str(self.checkpoint.get("base_graph_fingerprint"))
        if self.checkpoint.get("store") != self.store_root:
            raise FollowError(
                f"state folder {self.state} follows the store {self.checkpoint.get('store')}, not {self.store_root}"
            )
        if started_from != base_fp:
            raise FollowError(
                f"state folder {self.state} follows from graph {started_from[:12]}, not the given graph "
                f"{base_fp[:12]}: give the graph it started from, or a new state folder"
            )
        self._replay()
        self.store = PEStore.open(self.store_root, model=self.model, graph=self.graph, verify=verify)
        if self.checkpoint["pending"]:
            self._run_batch(self.checkpoint["pending"]["files"], self.checkpoint["pending"]["batch"], time.time())

    # -- checkpoint ----------------------------------------------------------------------------
    def _read_checkpoint(self) -> dict | None:
        try:
            return files.read_json(os.path.join(self.state, CHECKPOINT_FILE))
        except FileNotFoundError:
            return None

    def _write_checkpoint(self) -> None:
        files.write_json_atomic(os.path.join(self.state, CHECKPOINT_FILE), self.checkpoint, indent=1)

    @property
    def batches_done(self) -> int:
        return len(self.checkpoint["batches"])

    def consumed(self) -> set[str]:
        """Names of the update files applied or dead-lettered so far, or logged for the pending batch."""
        done = {name for batch in self.checkpoint["batches"] for name in batch["files"]}
        done |= set(self.checkpoint["dead"])
        if self.checkpoint["pending"]:
            done |= set(self.checkpoint["pending"]["files"])
        return done

    def _replay(self) -> None:
        """Bring the in-memory graph to the checkpoint's version: the logged files of every
        committed batch applied again, in order (no refresh: their store versions exist)."""
        from sparkgnn.graph.updates import GraphUpdate, apply

        self.running = RunningFingerprint.of(self.graph)
        for batch in self.checkpoint["batches"]:
            for name in batch["applied"]:
                update = GraphUpdate.read(self._logged(batch["batch"], name))
                self.running = self.running.advance(apply(update, self.graph))
                self.graph = self.running.graph
        want = self.checkpoint["batches"][-1]["graph_fingerprint"] if self.checkpoint["batches"] else None
        if want is not None and self.graph.fingerprint != want:
            raise FollowError(
                f"state folder {self.state}: replaying its log gives graph {self.graph.fingerprint[:12]}, not the "
                f"checkpoint's {want[:12]} (a log file changed or is missing); start a new state folder"
            )

    def _logged(self, batch: int, name: str) -> str:
        return os.path.join(self.state, LOG_DIR, str(batch), name)

    # -- the stream ----------------------------------------------------------------------------
    def _arrived(self) -> list[tuple[str, float]]:
        """(name, arrival time) of the update files not consumed yet, oldest first."""
        seen = self.consumed()
        out = []
        for entry in os.scandir(self.updates):
            if entry.name.startswith((".", "_")) or entry.name in seen or not entry.is_file():
                continue
            out.append((entry.name, entry.stat().st_mtime))
        return sorted(out, key=lambda item: (item[1], item[0]))

    def _rows(self, name: str) -> int:
        """Update rows of a file (its Parquet footer; 1 for a file that cannot be read)."""
        import pyarrow.parquet as pq

        try:
            return int(pq.read_metadata(os.path.join(self.updates, name)).num_rows)
        except Exception:  # noqa: BLE001 - a malformed file is dead-lettered when its batch runs
            return 1

    def poll(self, now: float | None = None, flush: bool = False) -> FollowProgress | None:
        """Apply one batch if one is due (max_batch_updates rows arrived, or the oldest file
        waited max_latency_s; `flush`: whatever arrived) and return its progress, else None."""
        now = time.time() if now is None else now
        arrived = self._arrived()
        if not arrived:
            return None
        chosen, rows = [], 0
        for name, _ts in arrived:
            chosen.append(name)
            rows += self._rows(name)
            if rows >= self.max_batch_updates:
                break
        oldest = arrived[0][1]
        if rows < self.max_batch_updates and now - oldest < self.max_latency_s and not flush:
            return None
        batch = self.batches_done + 1
        for name in chosen:
            os.makedirs(os.path.dirname(self._logged(batch, name)), exist_ok=True)
            shutil.copyfile(os.path.join(self.updates, name), self._logged(batch, name))
        self.checkpoint["pending"] = {"batch": batch, "files": chosen, "oldest_arrival": oldest}
        self._write_checkpoint()
        return self._run_batch(chosen, batch, oldest)

    def _run_batch(self, names: list[str], batch: int, oldest: float) -> FollowProgress:
        """Apply the logged files of `batch` one after another, refresh the store once for all
        of them, and commit the checkpoint."""
        from sparkgnn.graph.updates import GraphUpdate, apply
        from sparkgnn.pe.refresh import refresh_local

        oldest = float((self.checkpoint["pending"] or {}).get("oldest_arrival", oldest))
        started = time.perf_counter()
        graph, composed, summary, applied_names, dead = self.graph, None, BatchCounts(), [], []
        for name in names:
            path = self._logged(batch, name)
            try:
                update = GraphUpdate.read(path)
                step = apply(update, graph)
            except SparkGNNError as exc:
                self._dead_letter(name, path, str(exc), batch)
                dead.append(name)
                continue
            composed = step if composed is None else compose(composed, step, self.graph.x)
            graph = step.graph
            summary.counts_by_file.append(update.counts())
            applied_names.append(name)
        recomputed: list = []
        if composed is not None:
            running = self.running.advance(composed)
            store, report = refresh_local(
                self.graph, summary, self.model, self.store_root, store=self.store, verify=self.verify, applied=composed
            )
            self.store, self.graph, self.running = store, graph, running
            recomputed = [s["targets"] for s in report.layers]
        seconds = time.perf_counter() - started
        entry = {
            "batch": batch,
            "files": names,
            "applied": applied_names,
            "graph_fingerprint": self.graph.fingerprint,
            "store": self.store.base,
        }
        self.checkpoint["batches"].append(entry)
        self.checkpoint["dead"].extend(dead)
        self.checkpoint["pending"] = None
        self._write_checkpoint()
        progress = FollowProgress(
            batch=batch,
            files=len(applied_names),
            dead_letters=len(dead),
            updates=sum(sum(c.values()) for c in summary.counts_by_file),
            recomputed=recomputed,
            seconds=round(seconds, 4),
            latency_s=round(max(time.time() - oldest, 0.0), 4),
            graph_fingerprint=self.graph.fingerprint,
        )
        self.history.append(progress)
        log.info(progress.line())
        return progress

    def _dead_letter(self, name: str, path: str, reason: str, batch: int) -> None:
        with open(path, "rb") as fh:
            content = fh.read()
        self.dead.put(name, content, reason, batch_id=batch, source=os.path.join(self.updates, name))
        log.warning(f"refresh follow: batch {batch}: {name} dead-lettered: {reason}")

    def stop(self) -> None:
        """Ask run() to return after the batch in progress (e.g. from a signal handler)."""
        self._stop = True

    def run(
        self,
        *,
        max_batches: int | None = None,
        idle_timeout_s: float | None = None,
        stop_when: Callable[[RefreshFollower], bool] | None = None,
    ) -> list[FollowProgress]:
        """Follow until `max_batches` batches ran in this call, nothing arrived for
        `idle_timeout_s` seconds (what arrived is applied first), `stop_when(self)` is true, or
        stop() was called; returns this call's progress."""
        ran: list[FollowProgress] = []
        idle_since = time.monotonic()
        while not self._stop:
            progress = self.poll()
            if progress is not None:
                ran.append(progress)
                idle_since = time.monotonic()
            if max_batches is not None and len(ran) >= max_batches:
                break
            if stop_when is not None and stop_when(self):
                break
            if idle_timeout_s is not None and time.monotonic() - idle_since >= idle_timeout_s:
                flushed = self.poll(flush=True)
                if flushed is None:
                    break
                ran.append(flushed)
                idle_since = time.monotonic()
                continue
            if progress is None:
                time.sleep(self.poll_s)
        return ran

    def report(self) -> dict:
        """The checkpoint's facts and this process's batches (JSON-able)."""
        return {
            "batches": self.batches_done,
            "graph_fingerprint": self.graph.fingerprint,
            "store": self.store.base,
            "dead_letters": len(self.checkpoint["dead"]),
            "history": [asdict(p) for p in self.history],
        }
