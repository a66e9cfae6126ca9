"""The worker side of online serving: op "serve_batch" answers a batch of requests.

A serving worker (`sparkgnn-worker`, or the front end's own thread for the one-process
deployment) loads its deployment once (graph, model, PE store, mode; cached by the deployment's
JSON) and keeps it in memory; every batch then costs only the requests' own work.

WHY some batches are fused into one request and others are not: the scheduler's batches exist
to amortise per-call overhead over many small requests (GSM). A request's queries are new
vertices whose edges touch G; a mode that recomputes only the queries from stored values (HE)
gives each request the same answer whether it runs alone or next to others, PROVIDED no two
fused requests attach to the same G vertex (a shared endpoint would change that vertex's
degree statistics for both). Such requests are fused into one Request (query ids renumbered
apart, then mapped back), answered in one call. Modes whose answers depend on the batch (FULL
and EXACT recompute G vertices the requests change; SRPE's budget and NS's seeded sample are
per request) answer each request of the batch on its own: still one worker call per batch,
and the scheduler's order still decides who waits. `FUSABLE_MODES` names the first kind.

Deployments by id (serving.served): a batch names its deployment by id, never by paths, and a
worker answers only ids it was started with (its deployments file) or its controller registered;
the header carries no path and no engine option. A batch so names exactly one (graph, store)
version, whatever else the worker has cached.

Versions (Server.swap): a worker's `DeploymentCache` (an object the worker owns: the handler
`sparkgnn-worker` builds, or an in-process pool; passed to `serve_batch`/`serve_evict`, never a
module global) holds the deployments batches asked for, bounded in bytes (served.cache_bytes(),
least recently used first out, estimated from the graph's and the store's data files), until the
front end retires one: it withdraws the version from its workers'
deployments (pools.py) and then sends op "serve_evict" (`retire`), which drops only ids the
worker no longer serves, so a peer can make a worker drop nothing its controller still serves.
A deployment a batch of that worker is still answering (the in-process pool's other slots) is
dropped when that batch ends instead. Every reply's meta
carries the worker's pid, so the front end can tell which workers have loaded or dropped a version.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from sparkgnn.errors import USER_ERRORS
from sparkgnn.serving import served
from sparkgnn.serving.online import wire
from sparkgnn.serving.request import Request

BATCH_OP = "serve_batch"
EVICT_OP = "serve_evict"
FUSABLE_MODES = frozenset({"he"})


class Deployment:
    """G, the model and the PE store, loaded once per worker process, and one QueryEngine per
    mode asked for (all sharing one ServingContext: G's index is built once). Several threads
    answer on one deployment at once (an in-process pool's slots and express lanes): each engine
    is built once under a lock, and an engine keeps no per-call state (serving.context)."""

    def __init__(self, spec: dict, *, parts: dict | None = None):
        """Load `spec`'s graph, model and store; `parts` (a delta swap, serving.online.delta) hands
        over "graph", "model", "store" and "context" already built for this spec instead."""
        from sparkgnn.models import Model
        from sparkgnn.pe.published import open_graph
        from sparkgnn.pe.store import PEStore

        started = time.perf_counter()
        self.spec = spec
        if parts is not None:
            self.graph, self.model, self.store = parts["graph"], parts["model"], parts["store"]
        else:
            self.graph = open_graph(spec["graph"])  # a graph directory, or a published delta (pe/published.py)
            self.model = Model.load(spec["model"])
            self.store = PEStore.open(spec["store"], model=self.model, graph=self.graph) if spec.get("store") else None
        self.engines: dict = {}
        self._engines_lock = threading.Lock()  # one build per mode, however many threads ask at once
        # the ServingContext every engine shares, made by the first engine (or handed over)
        self.context: Any = None if parts is None else parts.get("context")
        self._cached_stores: list = []
        # how this deployment was loaded (reported in a swap's warm-up replies): "whole" or "delta"
        self.loaded: dict = {"how": "whole", "seconds": round(time.perf_counter() - started, 4)}
        ids = self.graph.ids
        self.fresh_base = int(ids.max()) + 1 if len(ids) else 0

    def engine(self, mode: str):
        """The QueryEngine answering `mode`, built on first use (once, under the lock)."""
        found = self.engines.get(mode)
        if found is None:
            with self._engines_lock:
                found = self.engines.get(mode)
                if found is None:
                    found = self._build_engine(mode)
                    self.engines[mode] = found  # published once ready: readers never see it half built
        return found

    def _build_engine(self, mode: str):
        """A new engine for `mode` on the shared context, its hot cache attached."""
        from sparkgnn.serving.engine import QueryEngine

        # validate=False: `answer` validates each request (or its caller did) before the engine
        # sees it, and a fused request is valid by construction; the engine would check again
        options = {"validate": False, **((self.spec.get("options") or {}).get(mode, {}))}
        found = QueryEngine(self.graph, self.model, mode=mode, store=self.store, context=self.context, **options)
        self.context = found.context
        self._attach_cache(found)
        return found

    def _attach_cache(self, engine) -> None:
        """Quiver's FAP placement (or GSM's degree cache): the hot rows of the stored layers this
        engine reads go to the fastest memory (serving.online.hotcache)."""
        cache = self.spec.get("cache") or {}
        if self.store is None or not hasattr(engine.mode, "stored") or cache.get("policy", "off") == "off":
            return
        from sparkgnn.serving.online.hotcache import attach_hot_cache

        stored = engine.mode.stored(engine.context)
        if any(stored is s for s in self._cached_stores):
            return
        device = cache.get("device", "cpu")
        attach_hot_cache(stored, cache["policy"], int(cache.get("bytes", 0)), self.store, self.graph, device)
        self._cached_stores.append(stored)

    def nbytes(self) -> int:
        """The estimate the cache bounds: bytes of the graph's and the store's data files."""
        from sparkgnn.pe.layout import dir_bytes

        total = 0
        for path in (self.spec["graph"], self.store.base if self.store is not None else None):
            try:
                total += dir_bytes(path) if path else 0
            except OSError:
                pass
        return total

    def cache_stats(self) -> dict | None:
        if not self._cached_stores:
            return None
        from sparkgnn.serving.online.hotcache import cache_stats

        return cache_stats(self._cached_stores[0])

    def answer(self, mode: str, requests: list[Request], *, checked: bool = False) -> tuple[list, dict]:
        """[(answer | None, error message | None)] per request, plus the summed breakdown.
        `checked`: the caller validated every request against this deployment's graph already
        (the in-process pool, for a batch whose version is the one intake checked it against), so
        they are not validated twice; requests from anywhere else are always validated here."""
        results: list = [None] * len(requests)
        breakdown: dict = {}
        valid = []
        for i, r in enumerate(requests):
            try:
                if not checked:
                    r.validate(self.graph)
                valid.append(i)
            except USER_ERRORS as exc:
                results[i] = (None, f"{type(exc).__name__}: {exc}")
        engine = self.engine(mode)
        if mode in FUSABLE_MODES:
            groups = self._fusion_groups([requests[i] for i in valid])
        else:
            groups = [[j] for j in range(len(valid))]
        for group in groups:
            members = [valid[j] for j in group]
            try:
                if len(members) == 1:
                    answer = engine.answer(requests[members[0]])
                    parts = [answer]
                else:
                    answer = engine.answer(self._fused([requests[i] for i in members]))
                    parts = _split(answer, [requests[i].batch_size for i in members])
            except USER_ERRORS as exc:
                for i in members:
                    results[i] = (None, f"{type(exc).__name__}: {exc}")
                continue
            for i, part in zip(members, parts, strict=True):
                results[i] = (part, None)
            for key, value in answer.breakdown.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    breakdown[key] = breakdown.get(key, 0) + value
        return results, breakdown

    def _fusion_groups(self, requests: list[Request]) -> list[list[int]]:
        """Requests grouped so that no two in a group touch the same G vertex (module doc)."""
        groups: list[list[int]] = []
        used: list[set] = []
        for j, r in enumerate(requests):
            ends = set(np.concatenate([r.src, r.dst]).tolist()) - set(r.qid.tolist())
            for g, taken in zip(groups, used, strict=True):
                if taken.isdisjoint(ends):
                    g.append(j)
                    taken |= ends
                    break
            else:
                groups.append([j])
                used.append(set(ends))
        return groups

    def _fused(self, requests: list[Request]) -> Request:
        """One request holding all of `requests`, query ids renumbered from above G's ids."""
        qids, xs, srcs, dsts = [], [], [], []
        next_id = self.fresh_base
        for r in requests:
            fresh = np.arange(next_id, next_id + r.batch_size, dtype=np.int64)
            next_id += r.batch_size
            qids.append(fresh)
            xs.append(r.x)
            srcs.append(_renumber(r.src, r.qid, fresh))
            dsts.append(_renumber(r.dst, r.qid, fresh))
        return Request("fused", np.concatenate(qids), np.concatenate(xs), np.concatenate(srcs), np.concatenate(dsts))


def _renumber(ids: np.ndarray, qid: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """`ids` with each of a request's query ids `qid` replaced by its `fresh` id (same position);
    other ids (G's vertices) unchanged. WHY not an IdIndex: building one per request of a batch
    (sort, identity check, table) cost more than the few comparisons a small request needs."""
    if len(qid) <= 1:
        return np.where(ids == qid[0], fresh[0], ids) if len(qid) else ids
    order = np.argsort(qid, kind="stable")
    ranked = qid[order]
    pos = np.minimum(np.searchsorted(ranked, ids), len(ranked) - 1)
    return np.where(ranked[pos] == ids, fresh[order[pos]], ids)


def _split(answer, sizes: list[int]) -> list:
    from sparkgnn.serving.modes import Answer

    out, start = [], 0
    for size in sizes:
        end = start + size
        pred = None if answer.pred is None else answer.pred[start:end]
        out.append(Answer(answer.qid[start:end], answer.h[start:end], pred, {}))
        start = end
    return out


def spec_key(spec: dict) -> str:
    """The id of a deployment spec (served.deployment_id): what batches and `retire` name."""
    return served.deployment_id(spec)


def _free_memory() -> None:
    gc.collect()  # engines, contexts and hot caches hold reference cycles: free the memory now
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # a hot cache's device rows: back to the device


class DeploymentCache:
    """The deployments one worker holds loaded, by id: least recently used first out once their
    estimated bytes pass `max_bytes()` (default served.cache_bytes()), a deployment a batch is
    answering from never dropped under it (`using`), a retired one dropped when its last batch
    ends. Owned by the worker that answers batches (the handler `sparkgnn-worker` builds, an
    in-process pool), so two workers in one process never share or clear each other's copies."""

    def __init__(self, max_bytes: Callable[[], int] = served.cache_bytes):
        import pyarrow  # noqa: F401 - imported before the freeze: its objects are then frozen
        import torch  # noqa: F401

        from sparkgnn.procgc import freeze_startup_objects
        from sparkgnn.serving import engine  # noqa: F401

        # before the first deployment loads: the collection after each eviction (_free_memory)
        # then walks the deployments, not every object torch and pyarrow hold (procgc)
        freeze_startup_objects()
        self._max_bytes = max_bytes
        self._deployments: dict[str, Deployment] = {}  # id -> the loaded deployment, least recent first
        self._sizes: dict[str, int] = {}  # id -> its estimated bytes (the LRU's weight)
        self._in_use: dict[str, int] = {}  # id -> batches answering from it now
        self._retiring: set[str] = set()  # retired while in use: dropped when its last batch ends
        self._lock = threading.Lock()  # guards the four above
        self._load_lock = threading.Lock()  # one load at a time: two threads asking for a new spec load it once

    def get(self, key: str) -> Deployment:
        """The deployment with id `key`, loaded on first use (UnknownDeployment for an id this
        process does not serve) and kept until retired or pushed out by the byte bound."""
        spec = served.lookup(key)
        with self._lock:
            found = self._deployments.pop(key, None)
            if found is not None:
                self._deployments[key] = found  # most recently used last
            self._retiring.discard(key)  # asked for again: a retirement still pending is void
        if found is not None:
            return found
        with self._load_lock:
            with self._lock:
                found = self._deployments.get(key)
            if found is None:
                found = self._load(spec)  # a failed load caches nothing
                dropped = self.put(key, found, found.nbytes())
                if dropped:
                    _free_memory()
        return found

    def _load(self, spec: dict) -> Deployment:
        """`spec` loaded: patched from a held deployment whose store version it is a small
        row-level successor of (serving.online.delta), else read whole."""
        from sparkgnn.serving.online.delta import patched_deployment

        with self._lock:
            held = list(reversed(self._deployments.values()))  # most recently used first
        reasons = []
        for previous in held:
            found, why = patched_deployment(previous, spec)
            if found is not None:
                return found
            reasons.append(why)
        found = Deployment(spec)
        if reasons:
            found.loaded["why_not_delta"] = reasons[0]
        return found

    def put(self, key: str, deployment: Deployment, nbytes: int) -> list[str]:
        """Hold `deployment` (estimated `nbytes`) as `key`, the most recently used; returns the ids
        dropped to stay within the byte bound (`key` stays even when it alone is over)."""
        with self._lock:
            self._deployments.pop(key, None)
            self._deployments[key] = deployment
            self._sizes[key] = int(nbytes)
            self._retiring.discard(key)
            return self._shrink_locked(keep=key)

    def _shrink_locked(self, keep: str) -> list[str]:
        dropped = []
        total = sum(self._sizes.get(k, 0) for k in self._deployments)
        for key in list(self._deployments):
            if total <= self._max_bytes():
                break
            if key == keep or self._in_use.get(key):
                continue
            del self._deployments[key]
            total -= self._sizes.pop(key, 0)
            dropped.append(key)
        return dropped

    @contextmanager
    def using(self, key: str) -> Iterator[Deployment]:
        """The deployment with id `key`, counted as in use until the block ends (a retirement
        and the byte bound wait)."""
        dep = self.get(key)
        with self._lock:
            self._in_use[key] = self._in_use.get(key, 0) + 1
        try:
            yield dep
        finally:
            with self._lock:
                left = self._in_use[key] - 1
                if left:
                    self._in_use[key] = left
                else:
                    del self._in_use[key]
                    if key in self._retiring:
                        self._retiring.discard(key)
                        if self._deployments.get(key) is dep:
                            del self._deployments[key]
                            self._sizes.pop(key, None)

    def retire(self, keys: list[str]) -> dict:
        """Drop the deployments `keys` (ids) this process no longer serves: now, or when the
        batch still answering from one ends ("deferred"). An id still served (its controller has
        not withdrawn it) is "kept": retirement cannot take a live deployment away. Returns what
        was done and what stays held, with the process id."""
        evicted, deferred = [], []
        kept = [key for key in keys if served.serves(key)]
        with self._lock:
            for key in keys:
                if key not in self._deployments or key in kept:
                    continue
                if self._in_use.get(key):
                    self._retiring.add(key)
                    deferred.append(key)
                else:
                    del self._deployments[key]
                    self._sizes.pop(key, None)
                    evicted.append(key)
            held = sorted(self._deployments)
        if evicted:
            _free_memory()
        return {"pid": os.getpid(), "evicted": evicted, "deferred": deferred, "kept": kept, "held": held}

    def clear(self) -> None:
        """Drop every deployment not in use (the worker is closing). No collection is forced: a
        service stopping must not pay a full garbage collection; the next one frees them."""
        with self._lock:
            for key in [k for k in self._deployments if not self._in_use.get(k)]:
                del self._deployments[key]
                self._sizes.pop(key, None)

    def keys(self) -> list[str]:
        """The deployment ids held loaded now."""
        with self._lock:
            return sorted(self._deployments)


def serve_evict(header: dict, tables: dict, deployments: DeploymentCache) -> dict:
    """Op "serve_evict": header "retire" lists deployment ids to drop from `deployments`
    (DeploymentCache.retire: only those this worker no longer serves); the meta says which were
    dropped, deferred, kept and still held, and the worker's pid."""
    served.check_header(header)
    keys = header.get("retire") or []
    if not isinstance(keys, list):
        raise served.UnknownDeployment("task header 'retire' must be a list of deployment ids")
    return {wire.META: wire.meta_table(deployments.retire([served.check_id(k, "retire") for k in keys]))}


def serve_batch(header: dict, tables: dict, deployments: DeploymentCache) -> dict:
    """Answer one batch from the deployment `deployments` holds (or loads): tables "nodes"/"edges"
    with `req`, header "deployment" (an id this worker serves), "requests" (their ids, in batch
    order) and "mode" (and "warm_modes": engines to build first). Returns "answer" + "meta"
    (per-request errors by position in the batch, the worker's pid). A header naming paths or
    options, or an unknown id, is refused (one line)."""
    started = time.perf_counter()
    served.check_header(header)
    served.lookup(header.get("deployment"))  # a malformed or unserved id is refused before any table is read
    requests = wire.requests_from_batch([str(r) for r in header["requests"]], tables)
    return serve_requests(header, requests, deployments, started=started)


def serve_requests(
    header: dict,
    requests: list[Request],
    deployments: DeploymentCache,
    *,
    checked: bool = False,
    started: float | None = None,
) -> dict:
    """`serve_batch` for requests already in memory: answer_requests' answers and meta as the
    tables a worker sends (answer, meta)."""
    answers, meta = answer_requests(header, requests, deployments, checked=checked, started=started)
    node, h, pred = answers.arrays()
    return {"answer": wire.answer_table(answers.req, node, h, pred), wire.META: wire.meta_table(meta)}


def answer_requests(
    header: dict,
    requests: list,
    deployments: DeploymentCache,
    *,
    checked: bool = False,
    started: float | None = None,
) -> tuple[wire.BatchAnswers, dict]:
    """The batch's answers (in numpy, per request) and its meta (errors by request index,
    breakdown, worker_s, cache, pid), for requests already in memory: the in-process pool hands
    over the front's Request objects and takes the answers back as they are (no Arrow tables
    built and read back). `checked`: they were validated against the graph of the deployment the
    header names (Deployment.answer then does not validate them again); `started`: the
    time.perf_counter() the batch's work began (default now)."""
    started = time.perf_counter() if started is None else started
    served.check_header(header)
    key = served.check_id(header.get("deployment"))
    warm_errors = {}
    with deployments.using(key) as dep:
        for mode in header.get("warm_modes") or []:  # a swap's warm-up: every served mode's engine
            try:
                dep.engine(str(mode))
            except USER_ERRORS as exc:  # that mode cannot be served from this store (reported)
                warm_errors[str(mode)] = f"{type(exc).__name__}: {exc}"
        results, breakdown = dep.answer(str(header["mode"]), requests, checked=checked)
        cache = dep.cache_stats()
    reqs, nodes, hs, preds, errors = [], [], [], [], {}
    for i, (answer, error) in enumerate(results):
        if error is not None:
            errors[str(i)] = error
            continue
        # answers are in the request's qid order already (modes answer rows in qid order)
        reqs.append(np.full(len(answer.qid), i, np.int32))
        nodes.append(np.asarray(requests[i].qid))
        hs.append(answer.h)
        preds.append(answer.pred)
    width = hs[0].shape[1] if hs else 0
    answers = wire.BatchAnswers.from_arrays(
        np.concatenate(reqs) if reqs else np.zeros(0, np.int32),
        np.concatenate(nodes) if nodes else np.zeros(0, np.int64),
        np.concatenate(hs) if hs else np.zeros((0, width), np.float32),
        None if not preds or preds[0] is None else np.concatenate(preds),
        len(requests),
    )
    meta = {
        "errors": errors,
        "breakdown": breakdown,
        "worker_s": time.perf_counter() - started,
        "cache": cache,
        "pid": os.getpid(),
    }
    if warm_errors:
        meta["warm_errors"] = warm_errors
    if header.get("warm_modes"):  # a swap's warm-up: how this worker loaded the version
        meta["loaded"] = dep.loaded
    return answers, meta
