"""RefreshFollower: keep a PE store fresh under a stream of graph updates (`sparkgnn-refresh follow`).

A long-running process that holds the current graph and store version, watches a folder of update
files (graph.updates Parquet, one per change set, the way the streaming job watches request
files), coalesces what arrived into batches -- closed when they hold `max_batch_updates` update
rows or their oldest file has waited `max_latency_s`, whichever comes first -- applies each batch
with the incremental refresh (pe/refresh.py: the delta / scratch kernel, reading only the rows it
needs from the row files) and commits it as a row-level store version (pe/versions.py).

Each waiting file is read once (pe/follow_files.py: its bytes and Arrow table; while a batch runs,
a read-ahead thread reads the files arriving meanwhile), and its batch logs and parses what was
read. WHY files of a batch are not simply merged into one update: an update is a set (its deletes
apply before its inserts), so two files merged into one would not in general mean what the two did
in order (a file inserting an edge and a later one deleting it). The files are applied in arrival
order, runs of them as ONE update only where that provably gives the same graph (a file of edge
inserts only joins the run before it: follow_files.apply_files), and the steps' row and edge
mappings are composed (`follow_state.compose`) into the one Applied the kernel takes: the old
version's graph to the batch's last.

Exactly once, by a checkpoint in the state folder (pe/follow_checkpoint.py: a document of constant
size written atomically per batch, and a journal the batches are appended to):

    <state>/checkpoint.json     counts, the base graph, the store, the batch in flight (synced)
    <state>/checkpoint.pending.json  the same, as of the latest batch started since (not synced)
    <state>/batches.jsonl       every batch done: its files (applied or dead-lettered), the graph
                                fingerprint after it
    <state>/log/<batch>/<file>  the bytes of every file of a batch, logged before it is applied
                                (a hard link to the file read, else the bytes read written)
    <state>/dead/               malformed files and files the graph refuses (streaming.DeadLetter)

A batch is first logged (its files linked, the checkpoint naming it `pending`), then refreshed and
checkpointed as done. Its recomputed rows are HELD IN MEMORY (`follow_state.LiveLayer`: by vertex
id, over the last committed store version), and the next batch reads them there; every
`commit_every_s` seconds, at `commit_rows` held rows, and when run() returns, the rows held are
committed as ONE row-level store version of the current graph (`commit`: a delta over the last
committed version, pe/versions.py) and the checkpoint records the batches the store holds
(`committed`); a version due after a batch is written on a background thread while the next
batches run (`background_commit`; docs/ARCHITECTURE.md says how its rows and checkpoint stay
exact). WHY: a store version per batch (writer attempt, Parquet and row files, fsyncs,
manifest, every 8th version a whole layer) costs several times the refresh of a small batch. A
follower killed at any point restarts from the newest graph it published whole at or before its
last commit (a full graph directory under the store root; else the base graph), replays the logged
batches after it in memory (graph.updates.apply, no refresh), checks that it reached the
checkpoint's graph fingerprint, commits the batches done since the last commit (one refresh_local
of them composed, from the committed graph: exact, and a version already (partly) written commits
only its missing layers), and redoes a pending batch from its log, so no file is applied twice or
lost. A malformed file, or one that does not apply to the graph as of its turn, is dead-lettered
with the reason and the stream moves on.

Every committed version is PUBLISHED (pe/published.py, unless `publish=False`): as a delta over the
previous publication (the update files the commit covers, checked by fingerprint), or every so
many deltas as a whole graph directory, under the store root, and `<store root>/.published/
latest.json` pointed at it, so a service following the store (`follow_store`) can swap to it; a
restarted follower publishes the committed version it starts from.

Compaction happens off the commit path: a background job (pe/background.py, one in flight)
writes a compacted segment of each store layer whose chain grew long (versions.write_compacted)
and the published graph's full directory (published.write_full); later commits lay their deltas
on them (versions.rebased, publish(full=)), so every version stays a small delta the service
patches. Only a chain past MAX_SEGMENTS (the job fell behind) is written whole on the commit
path. The job changes no content and is not in the checkpoint: a follower killed during it
resumes as before (the job is simply started again when due).

The follower keeps an EdgeIndex of its graph (pe/edge_index.py: in- and out-edges by vertex,
built on start, then advanced from each batch's change), which the refresh kernel plans
from instead of passing over every edge, so a small batch costs O(change), not O(E).

Each batch logs one line (files, update rows, vertices recomputed per layer, batch latency from
its oldest file's arrival to the batch's end, updates/s, whether a version was committed) and
keeps it in `history`; `throughput(history)` sums a run (updates/s, latency p50 / p99).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sparkgnn.errors import SparkGNNError
from sparkgnn.pe.background import BackgroundJob
from sparkgnn.pe.follow_checkpoint import CheckpointFiles
from sparkgnn.pe.follow_compact import FollowerCompaction, _Commit
from sparkgnn.pe.follow_files import Arrival, apply_files, log_arrival, read_arrival
from sparkgnn.pe.follow_state import AtGraph, FollowError, LiveLayer, RunningFingerprint, compose

if TYPE_CHECKING:
    from sparkgnn.graph.data import GraphData
    from sparkgnn.graph.updates import Applied
    from sparkgnn.pe.edge_index import EdgeIndex

log = logging.getLogger(__name__)

LOG_DIR = "log"
DEAD_DIR = "dead"


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
    committed: bool = False  # a store version of this batch's graph was committed with it
    committing: bool = False  # ... is being written on the background thread (background_commit)

    def line(self) -> str:
        rate = self.updates / self.seconds if self.seconds > 0 else 0.0
        per_layer = ", ".join(f"L{i + 1} {n}" for i, n in enumerate(self.recomputed)) or "nothing"
        return (
            f"refresh follow: batch {self.batch}: {self.updates} updates from {self.files} files, "
            f"{self.dead_letters} dead-lettered; recomputed {per_layer}; refresh {self.seconds:.3f}s "
            f"({rate:.0f} updates/s), latency {self.latency_s:.3f}s; version {self.graph_fingerprint[:12]}"
            + ("" if self.committed else " (being committed)" if self.committing else " (held in memory)")
        )


class RefreshFollower(FollowerCompaction):
    """Follow the update files in `updates`, keeping the PE store under `store` fresh (module doc).

    `graph`: the GraphData or graph directory the follow started from (the store holds its
    version); `model`: a Model or saved-model path; `state`: the checkpoint folder (created; a
    follower restarted on the same folder resumes). `max_batch_updates` and `max_latency_s`
    close a batch (update rows, seconds the oldest file waited); `poll_s`: how often the folder
    is listed; `verify`: how store versions are checked on open (PEStore.open);
    `background_commit`: write the versions due after a batch on a background thread while the
    next batches run (a version per batch, `commit_every_s` 0, is written before the batch
    returns, as `commit()` always does); `publish`:
    publish the graph of each committed version under the store root (pe/published.py), where a
    service with `follow_store` finds and swaps to it."""

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
        commit_every_s: float = 1.0,
        commit_rows: int = 100_000,
        commit_spacing: float = 0.0,
        publish: bool = True,
        background_commit: bool = True,
    ):
        from sparkgnn.deadletter import DeadLetter
        from sparkgnn.graph.reader import read_graph_dir
        from sparkgnn.models import Model
        from sparkgnn.pe.refresh import refresh_local
        from sparkgnn.pe.store import PEStore

        if (
            max_batch_updates < 1
            or max_latency_s < 0
            or poll_s <= 0
            or commit_every_s < 0
            or commit_rows < 1
            or commit_spacing < 0
        ):
            raise ValueError(
                f"max_batch_updates and commit_rows must be >= 1, max_latency_s, commit_every_s and commit_spacing "
                f">= 0 and poll_s > 0; got {max_batch_updates}, {commit_rows}, {max_latency_s}, {commit_every_s}, "
                f"{commit_spacing}, {poll_s}"
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
        self.commit_every_s = float(commit_every_s)
        self.commit_rows = int(commit_rows)
        self.commit_spacing = float(commit_spacing)
        self.publish = bool(publish)
        self.background_commit = bool(background_commit) and self.commit_every_s > 0
        self._in_flight: _Commit | None = None  # the commit being written in the background
        self.published: dict | None = None  # the latest publication (pe/published.py), once published
        self.history: list[FollowProgress] = []
        self.replayed_from = 0  # done batches the restart read from a published graph, not the log
        self._composed_since_commit: Applied | None = None  # set by _replay
        self._edge_index: tuple[GraphData, EdgeIndex] | None = None  # (graph, its index), built on start
        from sparkgnn.pe.refresh_kernel import GraphStats

        # node statistics of the batch's old and new graph (GCN's degrees), each computed once
        self._graph_stats = GraphStats()
        self._done_names: set[str] = set()  # consumed(): the names of the batches and dead letters in _seen
        self._seen = (0, 0)
        self._waiting: dict[str, float] = {}  # _arrived: unconsumed file -> arrival (first seen)
        self._arrivals: dict[str, Arrival] = {}  # file waiting for its batch -> its bytes, table and rows, read once
        self._updates_since_commit: list = []  # the GraphUpdates applied since the last commit, in order
        self._commit_seconds = 0.0  # the last commit's, publication included (commit_due)
        self._stop = False
        self._background = BackgroundJob("refresh follow compaction")
        self._compacted: dict[str, dict] = {}  # layer key -> compacted segment (versions.write_compacted)
        self._full_ready: str | None = None  # a published graph's full directory written beside
        os.makedirs(os.path.join(self.state, LOG_DIR), exist_ok=True)
        self.dead = DeadLetter(os.path.join(self.state, DEAD_DIR))
        base_fp = self.graph.fingerprint
        found, self._checkpoint_files = CheckpointFiles.load(self.state)
        self.checkpoint = found or {
            "base_graph_fingerprint": base_fp,
            "store": self.store_root,
            "batches": [],
            "dead": [],
            "pending": None,
            "committed": 0,
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
        self.store = PEStore.open(self.store_root, model=self.model, graph=self.committed_graph, verify=verify)
        if self.graph is not self.committed_graph:  # batches done since the last commit: commit them now
            self.store, _report = refresh_local(
                self.committed_graph,
                self._since_commit,
                self.model,
                self.store_root,
                store=self.store,
                verify=verify,
                applied=self._composed_since_commit,
            )
            self._mark_committed()
        self._hold_nothing()
        if self.checkpoint["pending"]:
            self._run_batch(self.checkpoint["pending"]["files"], self.checkpoint["pending"]["batch"], time.time())
            self.commit()
        self._publish()  # the committed version, unless already published (a restart after a commit)
        self.edge_index()  # built at start (O(E log E), once), not inside the first batch's latency

    # -- checkpoint ----------------------------------------------------------------------------
    def _write_checkpoint(self) -> None:
        """Record the checkpoint (follow_checkpoint.CheckpointFiles.write: synced when no batch is
        pending)."""
        self._checkpoint_files.write(self.checkpoint)

    @property
    def committed_batches(self) -> int:
        """Batches whose graph version the store holds (the later ones are held in memory)."""
        return int(self.checkpoint["committed"])

    def _mark_committed(self) -> None:
        self.checkpoint["committed"] = self.batches_done
        self.committed_graph = self.graph
        self._committed_sums = (self.running.vertex_sum, self.running.edge_sum)
        self._start_since_commit()

    def _start_since_commit(self) -> None:
        """Start the counts of the batches since the last commit afresh (the commit begun has the
        earlier ones)."""
        self._since_commit = BatchCounts()
        self._composed_since_commit = None
        self._updates_since_commit = []
        self._last_commit = time.monotonic()

    def _hold_nothing(self) -> None:
        self.live = {l: LiveLayer(self.store, l) for l in range(1, len(self.model.convs) + 1)}

    @property
    def batches_done(self) -> int:
        return len(self.checkpoint["batches"])

    def consumed(self) -> set[str]:
        """Names of the update files applied or dead-lettered so far, or logged for the pending batch."""
        pending = self.checkpoint["pending"]
        return self._done() | set(pending["files"] if pending else [])

    def _done(self) -> set[str]:
        """The names of the files of done batches and dead letters, kept up to date from the
        entries added since the last call (the folder is listed every `poll_s`, and a
        long-running follower has consumed many files: no pass over all of them per listing)."""
        batches, dead = self.checkpoint["batches"], self.checkpoint["dead"]
        seen_batches, seen_dead = self._seen
        for batch in batches[seen_batches:]:
            self._done_names.update(batch["files"])
        self._done_names.update(dead[seen_dead:])
        self._seen = (len(batches), len(dead))
        return self._done_names

    def _replay_start(self) -> int:
        """How many done batches the replay can skip: the latest batch at or before the last
        commit whose graph this store root published as a full graph directory (pe/published.py:
        the first publication and each compaction write one) is read from it instead of applying
        the log up to it, so a restart replays the batches since that directory, not every batch
        since the follow began; 0 (replay from the base graph) when there is none."""
        from sparkgnn.graph.reader import read_graph_dir
        from sparkgnn.pe.published import graph_dir

        batches = self.checkpoint["batches"]
        for k in range(self.committed_batches, 0, -1) if self.publish else ():
            want = str(batches[k - 1]["graph_fingerprint"])
            folder = graph_dir(self.store_root, want)
            if not os.path.isdir(folder):
                continue
            try:
                graph = read_graph_dir(folder)
            except (SparkGNNError, OSError) as exc:
                log.warning(f"refresh follow: published graph {folder} not read ({exc}); replaying the log instead")
                continue
            if graph.fingerprint != want:
                log.warning(f"refresh follow: published graph {folder} is not graph {want[:12]}; not used")
                continue
            self.graph = graph
            return k
        return 0

    def _replay(self) -> None:
        """Bring the in-memory graph to the checkpoint's version: the logged files of every
        done batch after `_replay_start` applied again, in order (no refresh). `committed_graph`:
        the graph as of the last batch the store holds; the batches after it (held in memory
        when the follower stopped) are composed into `_composed_since_commit` for __init__ to
        commit."""
        from sparkgnn.graph.updates import GraphUpdate, apply

        self.replayed_from = self._replay_start()
        self.running = RunningFingerprint.of(self.graph)
        self.committed_graph, self._since_commit, self._composed_since_commit = self.graph, BatchCounts(), None
        self._committed_sums = (self.running.vertex_sum, self.running.edge_sum)
        self._last_commit = time.monotonic()
        batches = self.checkpoint["batches"]
        for done, batch in enumerate(batches[self.replayed_from :], start=self.replayed_from + 1):
            for name in batch["applied"]:
                update = GraphUpdate.read(self._logged(batch["batch"], name))
                step = apply(update, self.graph)
                self.running = self.running.advance(step)
                self.graph = self.running.graph
                if done > self.committed_batches:
                    self._since_commit.counts_by_file.append(update.counts())
                    previous: Applied | None = self._composed_since_commit
                    self._composed_since_commit = (
                        step if previous is None else compose(previous, step, self.committed_graph.x)
                    )
            if done == self.committed_batches:
                self.committed_graph = self.graph
                self._committed_sums = (self.running.vertex_sum, self.running.edge_sum)
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
        """(name, arrival time) of the update files not consumed yet, oldest first. Only names
        not seen before are looked at (their modification time, read once, is the arrival);
        WHY: the update folder keeps every consumed file, and looking at each entry per listing
        made a poll cost grow with the files the follower ever consumed."""
        done, pending = self._done(), set((self.checkpoint["pending"] or {}).get("files") or [])
        listed = set(os.listdir(self.updates))
        waiting = self._waiting
        for name in waiting.keys() - listed:  # removed before their turn
            del waiting[name]
        for name in self._arrivals.keys() - listed:
            del self._arrivals[name]
        for name in listed - done - pending - waiting.keys():
            if name.startswith((".", "_")):
                continue
            try:
                info = os.stat(os.path.join(self.updates, name))
            except OSError:
                continue  # gone again
            if stat.S_ISREG(info.st_mode):
                waiting[name] = info.st_mtime
        for name in waiting.keys() & pending:
            del waiting[name]
        return sorted(waiting.items(), key=lambda item: (item[1], item[0]))

    def _rows(self, name: str, arrival: float) -> int:
        """Update rows of a file (1 for a file that cannot be read): the file is read ONCE per
        arrival time while it waits for its batch (follow_files.read_arrival), and its batch logs
        and parses what was read."""
        known = self._arrivals.get(name)
        if known is None or known.mtime != arrival:
            known = self._arrivals[name] = read_arrival(os.path.join(self.updates, name), arrival)
        return known.rows

    def poll(self, now: float | None = None, flush: bool = False) -> FollowProgress | None:
        """Apply one batch if one is due (max_batch_updates rows arrived, or the oldest file
        waited max_latency_s; `flush`: whatever arrived) and return its progress, else None
        (committing the rows held in memory when that is due, or with `flush`)."""
        now = time.time() if now is None else now
        self._adopt_commit(wait=False)  # a version written in the background since: now the held one
        arrived = self._arrived()
        if not arrived:
            if flush or self.commit_due():
                self.commit()
            return None
        chosen, rows = [], 0
        for name, ts in arrived:
            chosen.append(name)
            rows += self._rows(name, ts)
            if rows >= self.max_batch_updates:
                break
        oldest = arrived[0][1]
        if rows < self.max_batch_updates and now - oldest < self.max_latency_s and not flush:
            if self.commit_due():
                self.commit()
            return None
        batch = self.batches_done + 1
        os.makedirs(os.path.join(self.state, LOG_DIR, str(batch)), exist_ok=True)
        arrivals = {}
        for name in chosen:
            self._waiting.pop(name, None)
            arrival = self._arrivals.pop(name, None)
            if arrival is None or arrival.content is None:
                shutil.copyfile(os.path.join(self.updates, name), self._logged(batch, name))
                continue
            log_arrival(arrival, os.path.join(self.updates, name), self._logged(batch, name))
            arrivals[name] = arrival  # what was read on arrival, the logged bytes: parsed by the batch
        self.checkpoint["pending"] = {"batch": batch, "files": chosen, "oldest_arrival": oldest}
        self._write_checkpoint()
        stop = threading.Event()
        reader = threading.Thread(
            target=self._read_ahead, args=(stop, set(chosen)), name="refresh follow read-ahead", daemon=True
        )
        reader.start()
        try:
            return self._run_batch(chosen, batch, oldest, arrivals)
        finally:
            stop.set()
            reader.join()

    def _read_ahead(self, stop: threading.Event, chosen: set[str]) -> None:
        """While a batch runs (until `stop`), read the files arriving meanwhile into the arrival
        cache (follow_files.read_arrival), so the next batch finds them parsed. WHY: reading and
        parsing a small update file costs about as much as refreshing what it changes; Arrow
        does it without the GIL, so it overlaps the batch's refresh on another core. Only a
        cache: a file it did not read, or read before it changed, is read again by `_rows`."""
        done = self._done_names  # the names consumed before this batch (not changed while it runs)
        while not stop.is_set():
            try:
                listed = set(os.listdir(self.updates))
            except OSError:
                return
            for name in sorted(listed - done - chosen - self._arrivals.keys()):
                if stop.is_set():
                    return
                if name.startswith((".", "_")):
                    continue
                path = os.path.join(self.updates, name)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    self._arrivals[name] = read_arrival(path, info.st_mtime)
            stop.wait(self.poll_s / 5)

    def _run_batch(
        self, names: list[str], batch: int, oldest: float, arrivals: dict[str, Arrival] | None = None
    ) -> FollowProgress:
        """Apply the logged files of `batch` in order (runs of them merged where that gives the
        same graph, follow_files.apply_files; `arrivals`: the files as read on arrival),
        refresh the rows they reach once for all of them (held in memory, `live`), checkpoint
        the batch, and commit a store version when one is due (`commit_due`)."""
        from sparkgnn.pe.refresh import refreshed_layers

        oldest = float((self.checkpoint["pending"] or {}).get("oldest_arrival", oldest))
        started = time.perf_counter()
        graph, composed, summary, applied_names = self.graph, None, BatchCounts(), []
        steps, refused = apply_files(graph, names, arrivals or {}, lambda name: self._logged(batch, name))
        for name, reason in refused:
            self._dead_letter(name, self._logged(batch, name), reason, batch)
        dead = [name for name, _reason in refused]
        for step in steps:
            composed = step.applied if composed is None else compose(composed, step.applied, self.graph.x)
            graph = step.applied.graph
            summary.counts_by_file.append(step.update.counts())
            applied_names.extend(step.names)
            self._updates_since_commit.append(step.update)
        recomputed: list = []
        if composed is not None:
            running = self.running.advance(composed)
            old = self.graph
            old_index = self.edge_index()
            new_index = old_index.advance(composed)
            fresh = [
                (layer.layer, graph.ids[layer.rows], layer.h.numpy(), layer.state.numpy(), stats["targets"])
                for layer, stats in refreshed_layers(
                    old,
                    composed,
                    self.model,
                    None,
                    stored=lambda l: AtGraph(self.live[l], old),
                    indexes=(old_index, new_index),
                    graph_stats=self._graph_stats,
                )
            ]  # every layer computed before any is held: layer l+1 reads layer l's old rows
            deleted_ids = old.ids[composed.new_rows < 0]
            for l, ids, h, state, _n in fresh:
                self.live[l].hold(ids, h, state, deleted_ids)
            recomputed = [n for *_rest, n in fresh]
            self._since_commit.counts_by_file.extend(summary.counts_by_file)
            self.graph, self.running, self._edge_index = graph, running, (graph, new_index)
        entry = {
            "batch": batch,
            "files": names,
            "applied": applied_names,
            "dead": dead,
            "graph_fingerprint": self.graph.fingerprint,
        }
        self.checkpoint["batches"].append(entry)
        self.checkpoint["dead"].extend(dead)
        self.checkpoint["pending"] = None
        # not written now: the next batch's `pending` write or the next commit records this batch
        # as done (one fsync per batch); a follower killed before redoes it from its log, which
        # gives the same graph (and overwrites its dead letters with the same ones)
        committed = committing = False
        if self.commit_due():
            if self.background_commit:
                committing = self._start_commit()
            else:
                committed = self.commit()
        seconds = time.perf_counter() - started
        progress = FollowProgress(
            batch=batch,
            files=len(applied_names),
            dead_letters=len(dead),
            updates=sum(sum(c.values()) for c in summary.counts_by_file),
            recomputed=recomputed,
            seconds=round(seconds, 4),
            latency_s=round(max(time.time() - oldest, 0.0), 4),
            graph_fingerprint=self.graph.fingerprint,
            committed=bool(committed),
            committing=committing,
        )
        self.history.append(progress)
        log.info(progress.line())
        return progress

    def edge_index(self) -> EdgeIndex:
        """The EdgeIndex of the current graph (pe/edge_index.py): built once (O(E log E)), then
        advanced by each batch's change, so planning a batch reads the edges the change touches
        instead of passing over every edge."""
        from sparkgnn.pe.edge_index import EdgeIndex

        if self._edge_index is None or self._edge_index[0] is not self.graph:
            self._edge_index = (self.graph, EdgeIndex.of(self.graph))
        return self._edge_index[1]

    def held_rows(self) -> int:
        """Rows recomputed since the last commit and held in memory (the largest layer's count)."""
        return max((len(live.ids) for live in self.live.values()), default=0)

    def commit_due(self) -> bool:
        """Whether the batches held in memory are due for a store version: `commit_every_s`
        passed since the last commit -- and at least `commit_spacing` times the seconds that
        commit took --, or `commit_rows` rows are held. WHY the spacing (off by default): under a
        fast stream the rows a commit writes approach a whole layer (a 2-layer model's second
        layer reaches the out-neighbours of every changed vertex), so its cost stops growing with
        the interval; spacing commits by their own cost (2: at most about a third of the
        follower's time) leaves the rest to the batches. It delays the versions a service sees
        whenever a commit is slow (a loaded box), hence opt-in. `commit_every_s` 0 asks for a
        version per batch: unspaced."""
        if self.graph is self.committed_graph or self._in_flight is not None:
            return False
        waited = time.monotonic() - self._last_commit
        spacing = self.commit_spacing * self._commit_seconds if self.commit_every_s > 0 else 0.0
        due = waited >= max(self.commit_every_s, spacing)
        return due or self.held_rows() >= self.commit_rows

    def _dead_letter(self, name: str, path: str, reason: str, batch: int) -> None:
        with open(path, "rb") as fh:
            content = fh.read()
        self.dead.put(name, content, reason, batch_id=batch, source=os.path.join(self.updates, name))
        log.warning(f"refresh follow: batch {batch}: {name} dead-lettered: {reason}")

    def close(self, timeout_s: float = 60.0) -> bool:
        """End the commit being written in the background, if any (waiting for it), then wait up
        to `timeout_s` for the background compaction (FollowerCompaction.close)."""
        self._adopt_commit(wait=True)
        return super().close(timeout_s)

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
        stop() was called; the rows held in memory are committed before it returns. Returns
        this call's progress."""
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
                self._idle(self.poll_s)
        self.commit()  # what is held in memory reaches the store before run() returns
        self.close()
        return ran

    def report(self) -> dict:
        """The checkpoint's facts and this process's batches (JSON-able)."""
        return {
            "batches": self.batches_done,
            "graph_fingerprint": self.graph.fingerprint,
            "store": self.store.base,
            "dead_letters": len(self.checkpoint["dead"]),
            "published": self.published,
            "throughput": throughput(self.history),
            "history": [asdict(p) for p in self.history],
        }


def throughput(history: list[FollowProgress]) -> dict:
    """The figures of a run's batches: update rows, updates per second of follower time (refresh
    and commits), batch latency p50 / p99 (oldest file's arrival to its batch's end), and the
    mean vertices recomputed per batch at each layer."""
    seconds = sum(p.seconds for p in history)
    updates = sum(p.updates for p in history)
    latency = np.array([p.latency_s for p in history], np.float64)
    layers = max((len(p.recomputed) for p in history), default=0)
    recomputed = [p.recomputed for p in history if len(p.recomputed) == layers]
    return {
        "batches": len(history),
        "updates": updates,
        "updates_per_s": round(updates / seconds, 1) if seconds > 0 else 0.0,
        "latency_p50_s": round(float(np.percentile(latency, 50)), 4) if len(latency) else 0.0,
        "latency_p99_s": round(float(np.percentile(latency, 99)), 4) if len(latency) else 0.0,
        "recomputed_mean": [round(float(np.mean([r[i] for r in recomputed])), 1) for i in range(layers)],
    }
