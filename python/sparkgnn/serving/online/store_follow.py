"""Following a PE store (`follow_store`): the service swaps to each version that
`sparkgnn-refresh follow` commits and publishes under the store's root (pe/published.py).

Every `follow_interval_s` -- at once after a swap, and every FAST_S for FAST_FOR_S after it, so a
stream of publications is seen within milliseconds while an idle store costs one stat per
interval -- the follower thread reads the root's latest publication (a stat of
`latest.json` first: unchanged since it named the version served, nothing is read); when it names
a graph other than the one served, it swaps to it (VersionManager.swap: the version is loaded on
every worker -- patched from the served one when its store is a small row-level delta,
serving.online.delta, else read whole -- and switched to between batches; a graph published as a
delta is applied to the served version's graph in memory, at the front end and in each worker,
pe/published.open_graph), so an answer is
computed wholly on one committed version and names it (`Reply.version`). Versions published
while a swap runs are skipped: the next check goes straight to the latest one. A refused swap (a
graph directory pruned before the workers read it, a worker past the timeout) is logged, and
retried at the next publication, or after RETRY_S for the same one.

Freshness, from an update's arrival to an answer reflecting it: the follower's batch latency and
commit interval, then up to FAST_S (a stream) or `follow_interval_s` (the first version after
a quiet second), then the swap's load.
"""

from __future__ import annotations

import logging
import threading
import time

from sparkgnn.serving.online.deployments import SwapRefused

log = logging.getLogger(__name__)

RETRY_S = 5.0  # a publication whose swap was refused is tried again after this long
# after a swap, the next check comes at once (a version published while it ran), then every
# FAST_S (when shorter than the interval) until FAST_FOR_S passed without a new publication:
# a follower publishing a stream of versions is seen within FAST_S, an idle one costs one stat
# per interval
FAST_S = 0.005
FAST_FOR_S = 1.0
SWAP_TIMEOUT_S = 120.0  # for every worker to load a followed version


class StoreFollower:
    """Swap `versions` (the service's VersionManager) to the latest version published under the
    PE store root `store_root`, checking every `interval_s` seconds until `stop` is set."""

    def __init__(self, versions, store_root: str, interval_s: float, stop: threading.Event):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.versions = versions
        self.store_root = str(store_root)
        self.interval_s = float(interval_s)
        self._stop = stop
        self._refused: tuple[str, float] | None = None  # (graph fingerprint, when) of the last refusal
        # (latest.json's (inode, mtime, size), the graph served) when it last named the version
        # served: a check finding both the same reads nothing (the publisher replaces the file
        # whole: a new inode; a swap by hand changes the graph served)
        self._served_stat: tuple | None = None
        self._changed_at: float | None = None  # monotonic time of the last swap (the fast checks' window)
        self.checks = 0
        self.swaps = 0
        self.refusals = 0
        self.last_error: str | None = None

    def check(self) -> dict | None:
        """One check: swap to the latest publication when it is not the version served; returns
        the swap's report, or None when there was nothing new (or the swap was refused: logged)."""
        from sparkgnn.pe.published import PublishError, latest

        self.checks += 1
        stat = self._stat()
        if stat is not None and (stat, self.versions.current.graph_fingerprint) == self._served_stat:
            return None
        try:
            record = latest(self.store_root)
        except (OSError, PublishError) as exc:
            self._note_error(f"reading the publication: {exc}")
            return None
        if record is None:
            return None
        fp = record["graph_fingerprint"]
        if fp == self.versions.current.graph_fingerprint:
            self._served_stat = (stat, fp)
            return None
        if self._refused is not None and self._refused[0] == fp and time.monotonic() - self._refused[1] < RETRY_S:
            return None
        try:
            report = self.versions.swap(record["graph"], self.store_root, SWAP_TIMEOUT_S)
        except SwapRefused as exc:
            self._refused = (fp, time.monotonic())
            self.refusals += 1
            self._note_error(str(exc))
            return None
        self._refused = None
        if report.get("changed"):
            self._changed_at = time.monotonic()
            self.swaps += 1
            log.info(
                f"follow store: serving version {report['version']} (graph {fp[:12]}, load {report.get('load')}, "
                f"{report.get('seconds')} s)"
            )
        return report

    def _stat(self) -> tuple[int, int, int] | None:
        """latest.json's (inode, mtime ns, size), None when it cannot be read (the check then
        reads the file and reports why)."""
        import os

        from sparkgnn.pe.published import LATEST_FILE, PublishError, published_dir

        try:
            st = os.stat(os.path.join(published_dir(self.store_root), LATEST_FILE))
        except (OSError, PublishError):
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _note_error(self, why: str) -> None:
        self.last_error = why
        log.warning(f"follow store {self.store_root}: {why}")

    def next_wait(self, swapped: bool) -> float:
        """Seconds until the next check: none right after a swap, FAST_S within FAST_FOR_S of
        the last swap, else `interval_s` (module constants)."""
        if swapped:
            return 0.0
        recent = self._changed_at is not None and time.monotonic() - self._changed_at < FAST_FOR_S
        return min(self.interval_s, FAST_S) if recent else self.interval_s

    def loop(self) -> None:
        """The follower thread: check until stop, waiting `next_wait` between checks."""
        wait = self.interval_s
        while not self._stop.wait(wait):
            report = None
            try:
                report = self.check()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive one bad check
                self._note_error(f"{type(exc).__name__}: {exc}")
            wait = self.next_wait(bool(report and report.get("changed")))

    def info(self) -> dict:
        """What the thread did: checks, swaps, refusals, the last error."""
        return {
            "store": self.store_root,
            "interval_s": self.interval_s,
            "checks": self.checks,
            "swaps": self.swaps,
            "refusals": self.refusals,
            "last_error": self.last_error,
        }
