"""The version lifecycle of the online service: which (graph, PE store) Version it serves, swaps
to a new one, the batches in flight on each, and the eviction of replaced ones from the workers.

A swap (after an incremental PE refresh: a new graph directory and its store version under the
same root; over HTTP both must lie under the config's `swap_roots`: `check_swap_paths`) opens the
new pair at the front end (PEStore.open checks that the store is the graph's and the model's),
registers it with every pool (workers serve only registered deployments, which batches name by
id: pools.py), loads it on every worker of every pool (every served mode's engine), and only then
replaces the current Version, under the lock the dispatch threads take a Version under (`take`):
a batch is answered wholly by the Version it took when it was dispatched, batches dispatched
before the switch finish on the old one, and every batch after it takes the new one. Requests
still queued at the switch are answered by the new version (a worker validates each request
against its own graph again). Each Version counts its batches in flight; when the last batch of
a replaced one ends (`release`), the evictor thread (`evict_loop`) has every worker drop it (its
pools withdraw it, then op "serve_evict"; retried until each live worker has answered), so a
service swapped daily holds at most the versions some batch still uses. Swaps and evictions are
serialized (one lock), so a swap back to a version cannot be undone by a late eviction.

Delta swaps: when the new store version is a small row-level delta over the one served (what
`refresh_local` commits for a small update; serving.online.delta), each worker builds the new
version by patching the changed rows into new arrays gathered from the served version's, instead
of reading the store whole; larger changes and anything it cannot patch load whole. The protocol
above is the same either way (a batch still runs wholly on one version: the served version's
arrays are never written); the report says how each worker loaded it (`load`: "delta", "whole"
or "mixed"; `loaded`: per pool and pid, with the reason a worker did not patch). Every answer
names the version number it was computed on (`Reply.version`, the HTTP body's "version").

WHY an object of its own: the lifecycle has its own state (the version served, those draining
and being evicted, the swap log) and its own thread; the service's intake and dispatch only take
and release versions.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from sparkgnn.serving.online import wire
from sparkgnn.serving.online.batch_op import EVICT_OP
from sparkgnn.serving.online.bodies import BodyError, check_swap_timeout
from sparkgnn.serving.online.config import ServeConfig, swap_path
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.deployments import (
    SwapRefused,
    Version,
    batch_header,
    deployment_problems,
    fingerprint_of,
    probe_request,
    store_root,
)
from sparkgnn.serving.online.pools import ServeError

if TYPE_CHECKING:
    from sparkgnn.pe.store import PEStore

SWAP_LOG_ENTRIES = 100  # swap_log keeps the latest this many


def _load_kind(loaded: dict) -> str:
    """How a swap's workers loaded the new version: "delta" when every worker patched it from the
    version it served, "whole" when every worker read it whole, else "mixed" (serving.online.delta)."""
    kinds = {entry.get("how") for pool in loaded.values() for entry in pool.values()}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "whole")


def _broadcast_all(pools: list, header: dict, tables: dict, deadline: float) -> list:
    """Each pool's `broadcast(header, tables)` before `deadline` (monotonic), all pools at once
    (one thread per pool beyond the first: a swap waits for the slowest pool, not their sum);
    per pool, in order, (results, missing) or the exception it raised."""

    def one(i: int) -> None:
        try:
            out[i] = pools[i].broadcast(header, tables, max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - returned to the caller, which refuses the swap
            out[i] = exc

    out: list = [None] * len(pools)
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(1, len(pools))]
    for t in threads:
        t.start()
    if pools:
        one(0)
    for t in threads:
        t.join()
    return out


class VersionManager:
    """The versions one service serves. `pools`: the service's worker pools (each registers,
    loads and drops versions); `lock` and `stats`: the service's lock and counters dict (this
    object keeps "version", "graph_fingerprint", "swaps", "swaps_refused" and "evicted" in it);
    `stop`: set when the service stops (ends `evict_loop`)."""

    def __init__(
        self,
        config: ServeConfig,
        model,
        pools: list,
        first: Version,
        *,
        lock: threading.Lock,
        stats: dict,
        stop: threading.Event,
    ):
        self.config = config
        self._model = model
        self.pools = pools
        self._version = first
        self._draining: list[Version] = []  # replaced, with batches still in flight
        self._evictions: list[Version] = []  # replaced and drained: workers must drop them
        self._wake = threading.Event()
        self._swap_lock = threading.Lock()  # one swap or eviction pass at a time
        self._lock = lock
        self._stats = stats
        self._stop = stop
        self.swap_log: list[dict] = []
        # the graph of the version served when it was built from a published delta (the next delta
        # applies to it), and that of the version being opened by a swap (held once it switches)
        self._held_graph = None
        self._opened_graph = None
        # the PE store opened (checked) for the version served, and for the one being opened: the
        # next version's open does not list the segments it shares with it again (PEStore.open)
        self._held_store: PEStore | None = None
        self._opened_store: PEStore | None = None

    @property
    def current(self) -> Version:
        """The version served now (batches dispatched from now on take it)."""
        return self._version

    def warm_up(self) -> None:
        """Each pool's workers load the current version now, with a one-query request on a
        vertex of G, so the first client does not pay the load."""
        probe = probe_request(self._version.facts)
        header = batch_header(self._version, self.config.mode, [probe])
        tables = wire.batch_tables([probe])
        for pool in self.pools:
            pool.warm_up(header, tables)

    def swap(self, graph: str, store: str | None = None, timeout_s: float = 300.0) -> dict:
        """Serve `graph` (a graph directory) with the PE store `store` (a store root, or a version
        folder; default: the root of the store served now) from the next batch on: open and
        check the pair, load it on every worker (within `timeout_s`), then switch. Returns a
        report; raises SwapRefused saying why, the current version still serving. One swap at a
        time (a second waits)."""
        graph = str(graph)
        try:
            timeout_s = check_swap_timeout(timeout_s)
        except BodyError as exc:
            raise ServeError(str(exc)) from None
        with self._swap_lock:
            old = self._version
            store = store_root(old.store) if store is None else str(store)
            started = time.monotonic()
            try:
                new = self._open_version(old, graph, store)
                if new.key == old.key:
                    return {"changed": False, **old.describe()}
                warmed, warm_errors, loaded = self._warm_version(old, new, timeout_s)
            except SwapRefused as exc:
                with self._lock:
                    self._stats["swaps_refused"] += 1
                    self._log_swap({"changed": False, "graph": graph, "store": store, "refused": str(exc)})
                raise
            with self._lock:  # the switch: every batch dispatched from here on takes `new`
                self._version = new
                self._held_graph = self._opened_graph
                self._held_store = self._opened_store
                self.config.graph, self.config.store = new.graph, new.store
                old.replaced = True
                in_flight = old.in_flight
                (self._draining if in_flight else self._evictions).append(old)
                self._stats["version"] = new.number
                self._stats["graph_fingerprint"] = new.graph_fingerprint
                self._stats["swaps"] += 1
                report = {
                    "changed": True,
                    **new.describe(),
                    "previous": old.describe(),
                    "previous_batches_in_flight": in_flight,
                    "warmed": warmed,
                    "warm_errors": warm_errors,
                    "load": _load_kind(loaded),
                    "loaded": loaded,
                    "seconds": round(time.monotonic() - started, 3),
                }
                self._log_swap(report)
        self._wake.set()
        return report

    def check_swap_paths(self, graph: str, store: str | None) -> tuple[str, str | None]:
        """(graph, store) as a swap asked over the wire may open them: each under one of the
        config's `swap_roots` (config.swap_path), else SwapRefused. A path outside the roots and
        a missing one are refused in the same words, so the refusal reveals no file's existence."""
        roots, schemes = self.config.swap_roots, self.config.swap_schemes
        if not roots:
            why = "swaps over the wire are off: the deployment's config lists no `swap_roots`"
        else:
            checked = [swap_path(p, roots, schemes) if p is not None else None for p in (graph, store)]
            if checked[0] is not None and (store is None or checked[1] is not None):
                return checked[0], checked[1]
            why = "its graph and store must be existing paths under the service's `swap_roots`"
        with self._lock:
            self._stats["swaps_refused"] += 1
            self._log_swap({"changed": False, "graph": graph, "store": store, "refused": why})
            number = self._version.number
        raise SwapRefused(f"swap refused: {why}; still serving version {number}")

    def _log_swap(self, entry: dict) -> None:
        self.swap_log.append(dict(entry, at=time.time()))
        del self.swap_log[:-SWAP_LOG_ENTRIES]

    def _refusal(self, old: Version, graph: str, store: str | None, why: str) -> SwapRefused:
        return SwapRefused(
            f"swap to graph {graph} with PE store {store} refused: {why}; still serving version "
            f"{old.number} (graph {old.graph}, fingerprint {old.graph_fingerprint[:12] or 'unknown'})"
        )

    def _open_version(self, old: Version, graph: str, store: str | None) -> Version:
        """The new version as the front end holds it, after PEStore.open has checked that the
        store is this graph's and this model's (file sizes: each worker checks checksums when
        it loads the store)."""
        from sparkgnn.pe.published import is_delta, open_graph
        from sparkgnn.pe.store import PEStore

        try:
            # a published delta (pe/published.py) is applied to the graph held for the version served
            data = open_graph(graph, held=self._held_graph) if is_delta(graph) else None
            pair = graph if data is None else data
            opened = (
                PEStore.open(store, model=self._model, graph=pair, verify="sizes", trusted_from=self._held_store)
                if store
                else None
            )
            if data is not None:
                facts = GraphFacts.of_graph(data, opened, self._model.num_rounds)
                fingerprint = str(data.fingerprint)
            else:
                facts = GraphFacts.load(graph, opened, self._model.num_rounds)
                fingerprint = str(opened.manifest["graph_fingerprint"] if opened else fingerprint_of(graph))
        except Exception as exc:  # noqa: BLE001 - an operator's input: every failure is a refusal
            raise self._refusal(old, graph, store, f"{type(exc).__name__}: {exc}") from exc
        self._opened_graph, self._opened_store = data, opened
        if facts.feature_dim != old.facts.feature_dim:
            raise self._refusal(
                old, graph, store, f"its features are {facts.feature_dim} wide, the model takes {old.facts.feature_dim}"
            )
        problems = deployment_problems(self.config.modes, self.config.mode_options, self.config.cache, opened)
        if problems:
            raise self._refusal(old, graph, store, problems)
        return Version(old.number + 1, graph, store, self.config.deployment(graph, store), facts, fingerprint)

    def _warm_version(self, old: Version, new: Version, timeout_s: float) -> tuple[dict, dict, dict]:
        """Every worker of every pool loads `new` (and every served mode's engine) and answers a
        probe on it; ({pool: [pids]}, {mode: error} for modes whose engine could not be built,
        {pool: {pid: how it loaded}}: "delta" or "whole", serving.online.delta).
        Refuses when a worker fails, the probe fails, or a worker is not reached in time; what
        some workers loaded is then dropped again (the evictor)."""
        probe = probe_request(new.facts)
        header = dict(batch_header(new, self.config.mode, [probe]), warm_modes=list(self.config.modes))
        for pool in self.pools:
            pool.register(new.spec)  # withdrawn again by the evictor if the swap is refused
        tables = wire.batch_tables([probe])
        deadline = time.monotonic() + timeout_s
        warmed: dict = {}
        warm_errors: dict = {}
        loaded: dict = {}
        try:
            for pool, outcome in zip(self.pools, _broadcast_all(self.pools, header, tables, deadline), strict=True):
                if isinstance(outcome, Exception):  # the worker's error, named in the refusal
                    raise self._refusal(
                        old, new.graph, new.store, f"a worker of pool {pool.name!r} failed to load it: {outcome}"
                    ) from outcome
                results, missing = outcome
                if missing:
                    raise self._refusal(
                        old,
                        new.graph,
                        new.store,
                        f"worker(s) {missing} of pool {pool.name!r} did not load it within {timeout_s:g} s",
                    )
                for result in results.values():
                    meta = wire.read_meta(result)
                    if meta.get("errors"):
                        error = next(iter(meta["errors"].values()))
                        raise self._refusal(old, new.graph, new.store, f"its probe request failed: {error}")
                    warm_errors.update(meta.get("warm_errors") or {})
                    if meta.get("loaded"):
                        loaded.setdefault(pool.name, {})[str(meta.get("pid"))] = meta["loaded"]
                warmed[pool.name] = sorted(results)
            if warm_errors:  # a served mode would fail on every request after the switch
                broken = "; ".join(f"mode {m!r}: {e}" for m, e in sorted(warm_errors.items()))
                raise self._refusal(old, new.graph, new.store, f"it cannot serve every served mode ({broken})")
        except SwapRefused:
            with self._lock:
                new.replaced = True
                self._evictions.append(new)
            self._wake.set()
            raise
        return warmed, warm_errors, loaded

    def take(self) -> Version:
        """The version a batch about to be dispatched runs on, counted in flight until `release`."""
        with self._lock:
            version = self._version
            version.in_flight += 1
            return version

    def release(self, version: Version) -> None:
        """A batch taken on `version` ended; the last batch of a replaced version wakes the evictor."""
        with self._lock:
            version.in_flight -= 1
            drained = version.replaced and not version.in_flight and version in self._draining
            if drained:
                self._draining.remove(version)
                self._evictions.append(version)
        if drained:
            self._wake.set()

    def wake(self) -> None:
        """Wake the evictor (a drained version, or stop)."""
        self._wake.set()

    def evict_loop(self) -> None:
        """The evictor thread: until stop, have the workers drop each drained version. Blocks
        while nothing is to evict; retries every second while an eviction is left over."""
        while not self._stop.is_set():
            self._wake.wait(1.0 if self._evictions else None)
            self._wake.clear()  # before reading _evictions: a wake set after it is kept
            if self._evictions and not self._stop.is_set():
                self.evict_pass()

    def evict_pass(self, timeout_s: float = 5.0) -> None:
        """Have every worker drop each drained version; a version a worker could not be reached
        for stays listed and is retried (its other workers are not asked again)."""
        with self._swap_lock:  # a swap back to the version cannot interleave
            with self._lock:
                live = {self._version.key, *(v.key for v in self._draining)}
                todo = list(self._evictions)
            for version in todo:
                complete = True
                if version.key not in live:  # else it serves again: nothing to drop
                    header = {"op": EVICT_OP, "retire": [version.key]}
                    for pool in self.pools:  # a worker drops only what its pool withdrew
                        pool.withdraw(version.key)
                    for p, pool in enumerate(self.pools):
                        reached = version.dropped_by.setdefault(p, set())
                        try:
                            results, missing = pool.broadcast(header, {}, timeout_s, reached, call_timeout_s=timeout_s)
                        except Exception:  # noqa: BLE001 - a worker died or timed out: retried next pass
                            complete = False
                            continue
                        reached.update(results)
                        complete = complete and not missing
                if complete:
                    with self._lock:
                        self._evictions.remove(version)
                        if version.key not in live:
                            self._stats["evicted"] += 1

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait until every replaced version has drained and been dropped by every worker; False
        when some still is after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._draining and not self._evictions:
                    return True
            if time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(0.02)

    def info(self) -> dict:
        """The version served now, and replaced ones still draining or being dropped."""
        with self._lock:
            return {
                **self._version.describe(),
                "swaps": self._stats["swaps"],
                "draining": [{"version": v.number, "batches_in_flight": v.in_flight} for v in self._draining],
                "evicting": [v.number for v in self._evictions],
            }
