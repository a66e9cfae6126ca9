"""The refresh follower's commit side (pe/follow.py's RefreshFollower mixes it in): a commit
begun on the follower's thread (what it writes frozen), written inline or on a background
thread beside the next batches, and ended on the follower's thread (the version held,
checkpointed, published); each refreshed layer committed as a delta over the last version --
rebased on a compacted segment its background job wrote, or whole as the synchronous fallback
--, the published graph as a delta over the latest publication, and the background job
(pe/background.py) that writes the compacted segments and full graph directories those chains
are rebased on.

WHY apart: the follower's loop (arrival, batches, checkpoint, replay) and the way its versions
are written and their chains stay bounded change for different reasons; this is the second.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgnn.pe.follow_state import AtGraph

if TYPE_CHECKING:
    from sparkgnn.graph.data import GraphData
    from sparkgnn.pe.background import BackgroundJob
    from sparkgnn.pe.follow_state import LiveLayer, RunningFingerprint
    from sparkgnn.pe.published import Delta
    from sparkgnn.pe.refresh import RefreshReport
    from sparkgnn.pe.store import PEStore

log = logging.getLogger(__name__)

# the longest chain of segments a follower's delta may lie on while its background compaction
# runs (versions.MAX_SEGMENTS bounds the chains refresh_local writes): past it the layer is
# written whole on the commit path, the fallback when the background job falls behind
MAX_SEGMENTS = 16
PUBLISH_DIR = "publish"  # <state>/publish/: the merged update files of the delta being published
# likewise for the published graph's chain of deltas (published.COMPACT_EVERY / COMPACT_BYTES
# bound what a publisher without a background compaction writes)
PUBLISH_COMPACT_FACTOR = 2


@dataclass
class _Commit:
    """A commit begun (RefreshFollower._begin_commit): what it writes, frozen, and once written
    (on the background thread or inline) the version opened or the error."""

    new: GraphData
    old: GraphData
    over: PEStore
    batches: int  # batches done that the version holds
    sums: tuple[int, int]  # the running fingerprint's sums of `new`
    delta: Delta
    live: dict[int, LiveLayer]  # snapshots of the layers' held rows
    report: RefreshReport
    started: float
    thread: threading.Thread | None = None
    store: PEStore | None = None
    error: BaseException | None = None


class FollowerCompaction:
    """Commit, publication and background compaction of a RefreshFollower (module doc); the
    attributes below are the follower's."""

    store: PEStore
    store_root: str
    graph: Any
    committed_graph: Any
    model: Any
    verify: str
    live: dict[int, LiveLayer]
    publish: bool
    published: dict | None
    checkpoint: dict
    running: RunningFingerprint
    _committed_sums: tuple
    _background: BackgroundJob
    _compacted: dict[str, dict]
    _full_ready: str | None
    _updates_since_commit: list
    _since_commit: Any
    _in_flight: _Commit | None
    _commit_seconds: float
    state: str

    @property
    def committed_batches(self) -> int:
        raise NotImplementedError

    @property
    def batches_done(self) -> int:
        raise NotImplementedError

    def _logged(self, batch: int, name: str) -> str:
        raise NotImplementedError

    def _write_checkpoint(self) -> None:
        raise NotImplementedError

    def _mark_committed(self) -> None:
        raise NotImplementedError

    def _hold_nothing(self) -> None:
        raise NotImplementedError

    def _start_since_commit(self) -> None:
        raise NotImplementedError

    def commit(self) -> bool:
        """Commit the rows held in memory as one row-level store version of the current graph
        (a delta over the last committed version, or whole where versions.should_compact says
        so) and checkpoint it, after the commit running in the background (if one is) has
        finished; whether a version was committed by this call or by the one it waited for.
        Exact: the version equals a precompute of the current graph, whatever the batches it
        covers."""
        waited = self._adopt_commit(wait=True)
        pending = self._begin_commit()
        if pending is None:
            return waited
        self._write_commit(pending)
        self._end_commit(pending)
        return True

    def _start_commit(self) -> bool:
        """Begin a commit (`_begin_commit`) and write it on a background thread while the next
        batches run (`_adopt_commit` ends it); whether one was started."""
        pending = self._begin_commit()
        if pending is None:
            return False
        pending.thread = threading.Thread(
            target=self._write_commit, args=(pending,), name="refresh follow commit", daemon=True
        )
        self._in_flight = pending
        pending.thread.start()
        return True

    def _adopt_commit(self, wait: bool) -> bool:
        """End the commit written in the background, if there is one and it finished (`wait`:
        wait for it); whether one was ended. Its failure is raised here, on the follower's
        thread."""
        pending = self._in_flight
        if pending is None or pending.thread is None:
            return False
        if not wait and pending.thread.is_alive():
            return False
        pending.thread.join()
        self._in_flight = None
        self._end_commit(pending)
        return True

    def _idle(self, seconds: float) -> None:
        """Wait `seconds` between polls, ending the background commit as soon as it finishes
        within them (its version is published then, not at the next poll)."""
        pending = self._in_flight
        if pending is None or pending.thread is None:
            time.sleep(seconds)
            return
        pending.thread.join(seconds)
        self._adopt_commit(wait=False)

    def _begin_commit(self) -> _Commit | None:
        """The first step of a commit, on the follower's thread: what it writes, frozen (the
        graph, the counts and published delta since the last commit, a snapshot of every layer's
        held rows), the follower's since-commit counts started afresh; None when there is
        nothing to commit (the checkpoint written where batches were done)."""
        from sparkgnn.pe.refresh import RefreshReport

        if self.graph is self.committed_graph:
            if self.checkpoint["pending"] is None:
                self._write_checkpoint()  # batches done since the last write (dead letters only)
            return None
        started = time.perf_counter()
        self._take_compaction()
        new, old, over = self.graph, self.committed_graph, self.store
        report = RefreshReport(
            store="",
            graph_fingerprint=new.fingerprint,
            previous_graph_fingerprint=str(over.manifest["graph_fingerprint"]),
            updates=self._since_commit.counts(),
        )
        if report.graph_fingerprint == report.previous_graph_fingerprint:
            self._mark_committed()  # the batches since the commit left the graph as it was
            self._hold_nothing()
            self._write_checkpoint()
            return None
        pending = _Commit(
            new=new,
            old=old,
            over=over,
            batches=self.batches_done,
            sums=(self.running.vertex_sum, self.running.edge_sum),
            delta=self._delta_since_commit(),
            live={l: live.snapshot() for l, live in self.live.items()},
            report=report,
            started=started,
        )
        self._start_since_commit()
        return pending

    def _write_commit(self, pending: _Commit) -> None:
        """The writing half of a commit (on the background thread, or inline): every layer's
        rows from its snapshot as a delta or whole, the version's manifest, the version opened;
        a failure is kept for `_end_commit` to raise."""
        try:
            pending.store = self._write_version(pending)
        except BaseException as exc:  # noqa: BLE001 - raised again on the follower's thread
            pending.error = exc

    def _write_version(self, pending: _Commit):
        import torch

        from sparkgnn.pe.local import local_metrics
        from sparkgnn.pe.refresh import RefreshedLayer, carried_metrics
        from sparkgnn.pe.store import PEStore
        from sparkgnn.pe.writer import PEWriter

        new, old, over, report = pending.new, pending.old, pending.over, pending.report
        old_pos, in_old = old.id_index.lookup(new.ids)
        old_rows = np.where(in_old, old_pos, -1)
        deleted_ids = old.ids[~new.id_index.lookup(old.ids)[1]]
        writer = PEWriter(self.store_root, new, self.model, with_states=True, one_commit=True)  # one manifest write
        done = set(writer.completed_layers())
        for l, live in pending.live.items():
            rows = new.id_index.lookup(live.ids)[0]
            order = np.argsort(rows)
            stats: dict = {"layer": l, "targets": len(rows)}
            values = live.values_of
            layer = RefreshedLayer(
                l,
                AtGraph(live, old),
                old_rows,
                rows[order],
                torch.from_numpy(values["h"][order]),
                torch.from_numpy(values["state"][order]),
            )
            if l not in done:
                self._commit_layer(writer, over, layer, new.ids, deleted_ids, stats)
            report.layers.append(stats)
        chain = list((over.manifest.get("refresh") or {}).get("chain") or [over.manifest["graph_fingerprint"]])
        report.seconds = round(time.perf_counter() - pending.started, 3)
        writer.manifest["refresh"] = {**report.to_json(), "chain": [*chain, report.graph_fingerprint]}
        carried = carried_metrics(over)
        if carried is not None and not writer.has_metrics():
            writer.commit_metrics(local_metrics(new, *carried))
        writer.finish({"refresh_seconds": report.seconds})
        # `over` (the held version) was checked when it was opened: only the new version's own files
        # are checked again, not the segments it lies on
        return PEStore.open(self.store_root, model=self.model, graph=new, verify=self.verify, trusted_from=over)

    def _end_commit(self, pending: _Commit) -> None:
        """The last step of a commit, on the follower's thread: the version written becomes the
        held one (the layers keep only the rows held since its snapshot), the checkpoint records
        the batches it holds, and it is published."""
        if pending.error is not None:
            raise pending.error
        assert pending.store is not None  # _write_commit sets one of store and error
        self.store = pending.store
        self.checkpoint["committed"] = pending.batches
        self.committed_graph = pending.new
        self._committed_sums = pending.sums
        self.live = {l: live.rebased(self.store) for l, live in self.live.items()}
        self.checkpoint["store_version"] = self.store.base
        self._write_checkpoint()
        log.info(
            f"refresh follow: committed version {pending.new.fingerprint[:12]} at {self.store.base} "
            f"({', '.join(str(s.get('committed', 'earlier')) for s in pending.report.layers)}) in "
            f"{time.perf_counter() - pending.started:.3f}s"
        )
        self._publish(pending.delta)
        self._start_compaction()
        self._commit_seconds = time.perf_counter() - pending.started

    def _commit_layer(self, writer, over, layer, ids: np.ndarray, deleted_ids: np.ndarray, stats: dict) -> None:
        """Commit a refreshed layer as a delta over `over`'s -- its chain rebased on a compacted
        segment the background job wrote (versions.rebased) when there is one -- or whole where
        the change is large or the chain would pass MAX_SEGMENTS even rebased (the background
        job did not deliver in time: the synchronous fallback)."""
        from sparkgnn.pe import versions
        from sparkgnn.pe.refresh import commit_layer
        from sparkgnn.pe.writer import layer_key

        key = layer_key(layer.layer)
        chain = versions.chain_over(over.manifest, key)
        segment = self._compacted.get(key)
        bases = (versions.rebased(chain, segment) if segment is not None else None) or chain
        changed = len(layer.rows) + len(deleted_ids)
        large = changed >= versions.COMPACT_FRACTION * max(len(ids), 1)
        if large or len(bases) + 1 > MAX_SEGMENTS:
            commit_layer(writer, over, layer, ids, deleted_ids, stats)  # whole (versions.should_compact)
            return
        writer.commit_layer_delta(
            layer.layer, over, ids[layer.rows], layer.h.numpy(), layer.state.numpy(), deleted_ids, len(ids), bases=bases
        )
        on = (
            ""
            if bases is chain or segment is None
            else f", rebased on a compacted segment of {segment['version'][:12]}"
        )
        stats["committed"] = f"as a delta ({len(layer.rows)} rows, {len(deleted_ids)} tombstones{on})"

    def _start_compaction(self) -> None:
        """Start the background job (pe/background.py) that shortens the chains of the version
        just committed and published, when one is due and none runs: a compacted segment of each
        store layer whose chain reached half versions.MAX_SEGMENTS (versions.write_compacted), and
        the published graph's full directory when published.compaction_due. The next commits
        lay their deltas on them (`_commit_layer`, `_publish`); nothing waits for it."""
        from sparkgnn.pe import published, versions
        from sparkgnn.pe.writer import layer_key

        if self._background.busy:
            return
        base, manifest, graph = self.store.base, self.store.manifest, self.committed_graph
        keys = [
            layer_key(l)
            for l in self.live
            if len(versions.bases(manifest, layer_key(l))) + 1 >= max(versions.MAX_SEGMENTS // 2, 1)
        ]
        full = self.publish and self.published is not None and published.compaction_due(self.published)
        if not keys and not full:
            return
        root = self.store_root

        def work() -> dict:
            out: dict = {"segments": {key: versions.write_compacted(base, manifest, key) for key in keys}}
            if full:
                out["full"] = published.write_full(root, graph)
            return out

        self._background.start(base, work)

    def _take_compaction(self) -> None:
        """Adopt what the background job finished since the last commit (`_start_compaction`)."""
        done = self._background.take()
        if done is not None:
            self._compacted.update(done[1]["segments"])
            self._full_ready = done[1].get("full") or self._full_ready

    def close(self, timeout_s: float = 60.0) -> bool:
        """Wait up to `timeout_s` for the background compaction running, if any (run() does when
        it returns); whether none runs afterwards. The follower's state never depends on it."""
        return self._background.join(timeout_s)

    def _delta_since_commit(self) -> Delta:
        """The change from the committed graph to the current one as pe/published.py publishes it:
        the logged update files of the batches done since the last commit (applied ones, in
        order) and the fingerprint's running sums before and after."""
        from sparkgnn.pe.published import Delta

        paths = [
            self._logged(batch["batch"], name)
            for batch in self.checkpoint["batches"][self.committed_batches :]
            for name in batch["applied"]
        ]
        return Delta(
            base_fingerprint=self.committed_graph.fingerprint,
            base_sums=self._committed_sums,
            sums=(self.running.vertex_sum, self.running.edge_sum),
            updates=self._merged_updates(tuple(paths)),
        )

    def _merged_updates(self, paths: tuple[str, ...]) -> tuple[str, ...]:
        """The update files a delta publishes: the GraphUpdates applied since the last commit
        merged where that gives the same graph (follow_files.merged_for_publication), written
        under <state>/publish/, when that makes fewer files than the logged `paths`. WHY: a
        service applies a delta file by file, and a stream of small files would cost it one
        parse and apply per file; the merged ones apply to the same graph (the fingerprint the
        delta records checks it)."""
        import shutil

        from sparkgnn.pe.follow_files import merged_for_publication

        if not self.publish:
            return paths
        merged = merged_for_publication(self._updates_since_commit)
        if len(merged) >= len(paths):
            return paths
        folder = os.path.join(self.state, PUBLISH_DIR)
        shutil.rmtree(folder, ignore_errors=True)  # the previous commit's, published already
        os.makedirs(folder)
        return tuple(update.write(os.path.join(folder, f"{i:06d}.parquet")) for i, update in enumerate(merged))

    def _publish(self, delta: Delta | None = None) -> None:
        """Publish the committed version's graph (pe/published.py), when publishing: as `delta`
        over the latest publication where it applies, else whole."""
        from sparkgnn.pe.published import COMPACT_BYTES, COMPACT_EVERY, publish

        if self.publish:
            full, self._full_ready = self._full_ready, None
            self.published = publish(
                self.store_root,
                self.committed_graph,
                self.store.base,
                delta=delta,
                full=full,
                compact_every=PUBLISH_COMPACT_FACTOR * COMPACT_EVERY,
                compact_bytes=PUBLISH_COMPACT_FACTOR * COMPACT_BYTES,
            )
