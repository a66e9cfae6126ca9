"""The refresh follower's commit-side chain keeping (pe/follow.py's RefreshFollower mixes it in):
each refreshed layer committed as a delta over the last version -- rebased on a compacted
segment its background job wrote, or whole as the synchronous fallback -- the published graph
as a delta over the latest publication, and the background job (pe/background.py) that writes
the compacted segments and full graph directories those chains are rebased on.

WHY apart: the follower's loop (arrival, batches, checkpoint, replay) and the way its versions'
chains stay bounded change for different reasons; this is the second.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from sparkgnn.pe.background import BackgroundJob
    from sparkgnn.pe.follow_state import LiveLayer, RunningFingerprint
    from sparkgnn.pe.published import Delta
    from sparkgnn.pe.store import PEStore

# the longest chain of segments a follower's delta may lie on while its background compaction
# runs (versions.MAX_SEGMENTS bounds the chains refresh_local writes): past it the layer is
# written whole on the commit path, the fallback when the background job falls behind
MAX_SEGMENTS = 16
PUBLISH_DIR = "publish"  # <state>/publish/: the merged update files of the delta being published
# likewise for the published graph's chain of deltas (published.COMPACT_EVERY / COMPACT_BYTES
# bound what a publisher without a background compaction writes)
PUBLISH_COMPACT_FACTOR = 2


class FollowerCompaction:
    """Commit, publication and background compaction of a RefreshFollower (module doc); the
    attributes below are the follower's."""

    store: PEStore
    store_root: str
    committed_graph: Any
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
    state: str

    @property
    def committed_batches(self) -> int:
        raise NotImplementedError

    def _logged(self, batch: int, name: str) -> str:
        raise NotImplementedError

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
