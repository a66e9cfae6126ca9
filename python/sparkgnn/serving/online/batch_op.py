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

Versions (Server.swap): a batch names its deployment in full, so a worker answers it from exactly
that (graph, store) version, whatever else it has cached. A worker's cache holds every deployment
some batch asked for until the front end retires it (op "serve_evict", `retire`): the front end
sends that once no batch it dispatched still uses the version; a deployment a batch of this
process is still answering (another server in the same process, the in-process pool's other
slots) is dropped when that batch ends instead. Every reply's meta carries the worker's pid, so
the front end can tell which workers have loaded or dropped a version.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from sparkgnn.errors import USER_ERRORS
from sparkgnn.graph.index import IdIndex
from sparkgnn.serving.online import wire
from sparkgnn.serving.request import Request

BATCH_OP = "serve_batch"
EVICT_OP = "serve_evict"
FUSABLE_MODES = frozenset({"he"})

_DEPLOYMENTS: dict[str, Deployment] = {}  # spec_key -> the loaded deployment
_IN_USE: dict[str, int] = {}  # spec_key -> batches of this process answering from it now
_RETIRING: set[str] = set()  # retired while in use: dropped when its last batch ends
_LOCK = threading.Lock()  # guards the three above
_LOAD_LOCK = threading.Lock()  # one load at a time: two threads asking for a new spec load it once


class Deployment:
    """G, the model and the PE store, loaded once per worker process, and one QueryEngine per
    mode asked for (all sharing one ServingContext: G's index is built once)."""

    def __init__(self, spec: dict):
        from sparkgnn.graph.reader import read_graph_dir
        from sparkgnn.models import Model
        from sparkgnn.pe.store import PEStore

        self.spec = spec
        self.graph = read_graph_dir(spec["graph"])
        self.model = Model.load(spec["model"])
        self.store = PEStore.open(spec["store"], model=self.model, graph=self.graph) if spec.get("store") else None
        self.engines: dict = {}
        self.context: Any = None  # the ServingContext every engine shares, made by the first engine
        self._cached_stores: list = []
        ids = self.graph.ids
        self.fresh_base = int(ids.max()) + 1 if len(ids) else 0

    def engine(self, mode: str):
        found = self.engines.get(mode)
        if found is None:
            from sparkgnn.serving.engine import QueryEngine

            options = (self.spec.get("options") or {}).get(mode, {})
            found = QueryEngine(self.graph, self.model, mode=mode, store=self.store, context=self.context, **options)
            self.context = found.context
            self.engines[mode] = found
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

    def cache_stats(self) -> dict | None:
        if not self._cached_stores:
            return None
        from sparkgnn.serving.online.hotcache import cache_stats

        return cache_stats(self._cached_stores[0])

    def answer(self, mode: str, requests: list[Request]) -> tuple[list, dict]:
        """[(answer | None, error message | None)] per request, plus the summed breakdown."""
        results: list = [None] * len(requests)
        breakdown: dict = {}
        valid = []
        for i, r in enumerate(requests):
            try:
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
            queries = IdIndex(r.qid)

            def renumber(ids, queries=queries, fresh=fresh):
                rows, is_query = queries.lookup(ids)
                return np.where(is_query, fresh[rows], ids)

            qids.append(fresh)
            xs.append(r.x)
            srcs.append(renumber(r.src))
            dsts.append(renumber(r.dst))
        return Request("fused", np.concatenate(qids), np.concatenate(xs), np.concatenate(srcs), np.concatenate(dsts))


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
    """The cache key of a deployment spec (its JSON, keys sorted): what `retire` names."""
    return json.dumps(spec, sort_keys=True)


def deployment(spec: dict) -> Deployment:
    """The deployment of `spec`, loaded on first use and kept (until retired)."""
    key = spec_key(spec)
    with _LOCK:
        found = _DEPLOYMENTS.get(key)
        _RETIRING.discard(key)  # asked for again: a retirement still pending is void
    if found is not None:
        return found
    with _LOAD_LOCK:
        with _LOCK:
            found = _DEPLOYMENTS.get(key)
        if found is None:
            found = Deployment(spec)  # a failed load caches nothing
            with _LOCK:
                _DEPLOYMENTS[key] = found
                _RETIRING.discard(key)
    return found


@contextmanager
def using(spec: dict) -> Iterator[Deployment]:
    """The deployment of `spec`, counted as in use until the block ends (a retirement waits)."""
    dep = deployment(spec)
    key = spec_key(spec)
    with _LOCK:
        _IN_USE[key] = _IN_USE.get(key, 0) + 1
    try:
        yield dep
    finally:
        with _LOCK:
            left = _IN_USE[key] - 1
            if left:
                _IN_USE[key] = left
            else:
                del _IN_USE[key]
                if key in _RETIRING:
                    _RETIRING.discard(key)
                    if _DEPLOYMENTS.get(key) is dep:
                        del _DEPLOYMENTS[key]


def retire(keys) -> dict:
    """Drop the deployments `keys` (spec_key values) from this process's cache: now, or when the
    batch still answering from one ends ("deferred"). Returns what was done and what stays cached."""
    evicted, deferred = [], []
    with _LOCK:
        for key in keys:
            if key not in _DEPLOYMENTS:
                continue
            if _IN_USE.get(key):
                _RETIRING.add(key)
                deferred.append(key)
            else:
                del _DEPLOYMENTS[key]
                evicted.append(key)
        held = sorted(_DEPLOYMENTS)
    if evicted:
        gc.collect()  # engines, contexts and hot caches hold reference cycles: free the memory now
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # a hot cache's device rows: back to the device
    return {"pid": os.getpid(), "evicted": evicted, "deferred": deferred, "held": held}


def cached_keys() -> list[str]:
    """The spec keys this process holds loaded (tests and stats)."""
    with _LOCK:
        return sorted(_DEPLOYMENTS)


def serve_evict(header: dict, tables: dict) -> dict:
    """Op "serve_evict": header "retire" lists spec keys to drop (`retire`); the meta says which
    were dropped, deferred and still held, and the worker's pid."""
    keys = [str(k) for k in header.get("retire") or []]
    return {wire.META: wire.meta_table(retire(keys))}


def serve_batch(header: dict, tables: dict) -> dict:
    """Answer one batch: tables "nodes"/"edges" with `req`, header "deployment" and "requests"
    (their ids, in batch order) and "mode" (and "warm_modes": engines to build first). Returns
    "answer" + "meta" (per-request errors by position in the batch, the worker's pid)."""
    started = time.perf_counter()
    warm_errors = {}
    with using(header["deployment"]) as dep:
        for mode in header.get("warm_modes") or []:  # a swap's warm-up: every served mode's engine
            try:
                dep.engine(str(mode))
            except USER_ERRORS as exc:  # that mode cannot be served from this store (reported)
                warm_errors[str(mode)] = f"{type(exc).__name__}: {exc}"
        request_ids = [str(r) for r in header["requests"]]
        requests = wire.requests_from_batch(request_ids, tables)
        results, breakdown = dep.answer(str(header["mode"]), requests)
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
    table = wire.answer_table(
        np.concatenate(reqs) if reqs else np.zeros(0, np.int32),
        np.concatenate(nodes) if nodes else np.zeros(0, np.int64),
        np.concatenate(hs) if hs else np.zeros((0, width), np.float32),
        None if not preds or preds[0] is None else np.concatenate(preds),
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
    return {"answer": table, wire.META: wire.meta_table(meta)}
