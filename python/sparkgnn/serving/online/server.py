"""sparkgnn.serving.online.server.Server: the long-running online service (docs/ARCHITECTURE.md
"Online serving").

    clients --ZeroMQ (Arrow frames)--> intake --> scheduler (GSM) --> batcher --> router (Quiver)
            --HTTP/JSON (aiohttp)---->   |          degree order,      divider      PSGS -> pool
                                          |          T_d, aging                        |
            <------------------------ replies <-------- dispatch threads (one per pool slot)

WHY this shape:
  - The front end holds only GraphFacts (ids, in-degrees, PSGS: costs.py); the PE store lives in
    the pools' workers (pools.py, batch_op.py), so the front end's memory does not grow with the
    embeddings.
  - One scheduler queue for all requests, bounded (`capacity`): a full queue answers BUSY at once
    (back-pressure) instead of growing without limit. Batches are formed when a slot frees up
    (work-conserving), so under load they grow to T_d and under light load a request goes alone.
  - A request that cannot meet its deadline (its `deadline_ms`, else the config's, else the request
    timeout) is refused at intake, BUSY with Retry-After (admission.py): past capacity the service
    answers at capacity instead of queueing seconds of work. Idle, no thread wakes (stop() wakes
    them: one sentinel per dispatch thread).
  - Every wait has a timeout: a batch's call is awaited at most `batch_timeout_s` (then its
    requests are answered "timeout"; the slot stays taken until the call returns, so runaway
    calls never pile up), and a worker pool's call is also bounded by its dealer timeout and
    retries; a request that waited past `request_timeout_s` is answered "timeout" (HTTP 504,
    retry later), not kept.
  - Every resource is bounded: a request has at most `max_queries` query nodes, `max_edges` edges
    and a predicted cost (GraphFacts.pending, the in-degree sum GSM's scheduler uses) of
    `max_cost` (else "too_large": HTTP 413); the queue holds at most `capacity` requests and
    `queue_bytes` bytes of them (else "busy": HTTP 503, retry later); an HTTP body and a ZeroMQ
    message at most `max_body_bytes`; the modes served are the config's `modes` (by default the
    cheap reuse modes), any other is refused naming that setting.
  - The deployment is checked as a whole before it serves and before a swap switches: every mode
    it serves (the default `mode` is always among them) must be answerable from its store (a store
    for HE, SRPE and EXACT; with states for SRPE, EXACT and auto; a "fap" metrics table for the
    fap hot cache), else it does not start / the swap is refused naming the mode
    (deployments.deployment_problems).
  - Nothing from the wire is unpickled: ZeroMQ messages are the messenger's frames (JSON header +
    Arrow tables, messenger.protocol), HTTP bodies are JSON. Binds are loopback unless told; a
    non-loopback ZeroMQ bind needs CURVE keys and a non-loopback HTTP bind needs a token and TLS.

Versions (`swap`): the service serves one Version at a time (graph directory, PE store, the front
end's GraphFacts of that graph). A swap (after an incremental PE refresh: a new graph directory
and its store version under the same root; over HTTP both must lie under the config's
`swap_roots`: Server.check_swap_paths) opens the new pair at the front end (PEStore.open
checks that the store is the graph's and the model's), registers it with every pool (workers
serve only registered deployments, which batches name by id: pools.py), loads it on every
worker of every pool (every served mode's engine), and only then replaces the current Version, under the lock the
dispatch threads take a Version under: a batch is answered wholly by the Version it took when
it was dispatched, batches dispatched before the switch finish on the old one, and every batch
after it takes the new one. Requests still queued at the switch are answered by the new version
(a worker validates each request against its own graph again). Each Version counts its batches
in flight; when the last batch of a replaced one ends, the evictor thread has every worker drop
it (its pools withdraw it, then op "serve_evict"; retried until each live worker has answered),
so a service swapped daily holds at most the versions some batch still uses. Swaps and evictions are serialized.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from sparkgnn.serving.online import wire
from sparkgnn.serving.online.admission import Admission
from sparkgnn.serving.online.batch_op import BATCH_OP, EVICT_OP, FUSABLE_MODES
from sparkgnn.serving.online.bodies import BodyError, check_swap_timeout
from sparkgnn.serving.online.config import ServeConfig, over_caps, split_http_bind, swap_path
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.deployments import (
    SwapRefused,
    Version,
    deployment_problems,
    fingerprint_of,
    probe_request,
    store_root,
)
from sparkgnn.serving.online.pools import ROUTERS, ServeError, make_pool
from sparkgnn.serving.online.scheduler import SCHEDULERS, QueueFull, SchedulerError, ServiceModel, divide
from sparkgnn.serving.online.stats import OTHER_MODE, ServiceMetrics
from sparkgnn.serving.request import Request


@dataclass
class Outcome:
    """What one request gets back: an answer table, or an error. kind: "ok"; "error" (the
    request's fault); "too_large" (over the service's size or cost caps: split it); "busy" (the
    queue is full), "timeout" (it waited past the request timeout, or its batch ran past the batch
    deadline), "stopping" (the service is stopping): the server's limits, retry later; "failed"
    (its batch failed on a worker)."""

    request_id: str
    kind: str
    answer: object = None
    error: str | None = None
    queue_s: float = 0.0
    service_s: float = 0.0
    batch_requests: int = 0
    pool: str = ""
    version: int = 0  # the Version that answered it (0: none did)
    retry_after_s: float | None = None  # "busy": when a retry may be admitted (else the front's default)


@dataclass
class Ticket:
    request: Request
    mode: str
    arrived: float
    psgs: float
    deliver: object  # Callable[[Outcome], None]
    cost: float = 0.0
    nbytes: int = 0  # the request's arrays, counted against the queue's byte budget
    deadline: float = math.inf  # time.monotonic() past which its answer is no use (not started: "timeout")


def request_bytes(request: Request) -> int:
    """The bytes of a request's arrays (ids, features, edges): what it holds while queued."""
    return int(request.qid.nbytes + request.x.nbytes + request.src.nbytes + request.dst.nbytes)


class BatchDeadline(ServeError):
    """A batch's pool call did not return within the service's batch_timeout_s."""


class Server:
    def __init__(self, config: ServeConfig, *, start_pools: bool = True):
        from sparkgnn.models import Model
        from sparkgnn.pe.store import PEStore
        from sparkgnn.serving.modes import MODES

        self.config = config
        config.check()
        if config.mode not in config.modes:  # the default mode is served (requests naming none get it)
            config.modes = [*config.modes, config.mode]
        for mode in [config.mode, *config.modes]:
            MODES.lookup(mode)
        self._check_binds()
        model = self._model = Model.load(config.model)
        # the manifest and metrics tables only (file sizes checked; each worker checks checksums
        # when it loads the layers, which stay with the workers)
        store = PEStore.open(config.store, model=model, graph=config.graph, verify="sizes") if config.store else None
        problems = deployment_problems(config.modes, config.mode_options, config.cache, store)
        if problems:
            raise ServeError(f"deployment of graph {config.graph} with PE store {config.store}: {problems}")
        self.facts = GraphFacts.load(config.graph, store, model.num_rounds)
        fingerprint = fingerprint_of(config.graph, compute=False) or (store.manifest if store else {}).get(
            "graph_fingerprint"
        )
        self._version = Version(1, config.graph, config.store, config.deployment(), self.facts, fingerprint or "")
        self._draining: list[Version] = []  # replaced, with batches still in flight
        self._evictions: list[Version] = []  # replaced and drained: workers must drop them
        self._evict_wake = threading.Event()
        self._swap_lock = threading.Lock()  # one swap or eviction pass at a time
        self.swap_log: list[dict] = []
        self.service = ServiceModel()
        self.scheduler = SCHEDULERS.lookup(config.scheduler)(
            config.t_d,
            capacity=config.capacity,
            max_batch=config.max_batch,
            service=self.service,
            max_wait_factor=config.max_wait_factor,
            # answered request by request inside a call: one per call, so the scheduler picks
            # the next one whenever a slot frees (batch_op.FUSABLE_MODES)
            group_max_batch={mode: 1 for mode in config.modes if mode not in FUSABLE_MODES},
        )
        self.route = ROUTERS.lookup(config.router)
        # requests that cannot meet their deadline are refused at intake (admission.py)
        self.admission = Admission(
            max(1, sum(int(spec.get("width", 1)) for spec in config.pools)),
            config.t_d,
            {mode: self.scheduler.group_limit(mode) for mode in config.modes},
        )
        self.pools = [make_pool(spec) for spec in config.pools] if start_pools else []
        for pool in self.pools:  # what the workers serve is registered, never sent (serving.served)
            pool.register(self._version.spec)
        self._pool_queues: list[queue.Queue] = [queue.Queue() for _ in self.pools]
        self._busy = [0] * len(self.pools)
        self._free = threading.Semaphore(sum(p.width for p in self.pools) or 1)
        # one caller thread per slot: the dispatch thread awaits its call with a deadline
        self._callers = {
            (p, slot): ThreadPoolExecutor(1, thread_name_prefix=f"sparkgnn-serve-call-{pool.name}-{slot}")
            for p, pool in enumerate(self.pools)
            for slot in range(pool.width)
        }
        self._queued_bytes = 0  # of the requests in the scheduler (guarded by _lock)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._batcher: threading.Thread | None = None
        self._zmq: Any = None  # the ZmqFront, once started
        self.stats: dict[str, Any] = {  # counters, and the version served now
            "requests": 0,
            "answered": 0,
            "errors": 0,
            "busy": 0,
            "shed": 0,  # of the busy: refused at intake for a deadline they could not meet
            "too_large": 0,
            "batch_timeouts": 0,
            "batches": 0,
            "overflow": 0,
            "version": 1,
            "graph_fingerprint": self._version.graph_fingerprint,
            "swaps": 0,
            "swaps_refused": 0,
            "evicted": 0,
        }
        self.batch_log: list[dict] = []  # per batch: size, cost, psgs, pool, seconds (bounded)
        self.cache_stats: dict | None = None
        self.zmq_endpoint: str | None = None
        self.http_url: str | None = None
        self._http: object | None = None
        self.metrics = ServiceMetrics(config.modes, self.metrics_state)  # /metrics, the status line

    # -- lifecycle --------------------------------------------------------------------------
    def _check_binds(self) -> None:
        from sparkgnn.messenger.endpoints import check_bind, is_loopback

        check_bind(self.config.bind, self.config.curve_keys, bind_any=True)
        if self.config.curve_keys:
            from sparkgnn.messenger.security import CLIENT, check_server_dir

            check_server_dir(self.config.curve_keys, (CLIENT,))  # a bad keys folder: one line at start
        if self.config.http:
            host, _port = split_http_bind(self.config.http)
            host = f"[{host}]" if ":" in host else host
            if not is_loopback(f"tcp://{host}:1"):
                if not self.config.token:
                    raise ServeError(
                        f"HTTP bind {self.config.http} is not loopback: give a token (--token-file or "
                        "SPARKGNN_SERVE_TOKEN) that clients must send"
                    )
                if not self.config.tls_cert:
                    raise ServeError(
                        f"HTTP bind {self.config.http} is not loopback: serve HTTPS (--tls-cert and --tls-key), "
                        "else the token travels in clear text"
                    )

    def start(self) -> Server:
        self._warm_up()
        for p, pool in enumerate(self.pools):
            for slot in range(pool.width):
                self._spawn(f"dispatch-{pool.name}-{slot}", self._dispatch_loop, p, slot)
        self._batcher = self._spawn("batcher", self._batch_loop)
        self._spawn("evictor", self._evict_loop)
        from sparkgnn.serving.online.zmq_front import ZmqFront

        front = self._zmq = ZmqFront(self, self.config.bind, self.config.curve_keys)
        ready = threading.Event()
        self._spawn("intake", front.run, ready, self._stop)
        if not ready.wait(10.0):
            raise ServeError("the ZeroMQ intake did not start within 10 s")
        self.zmq_endpoint = front.endpoint
        if self.config.http:
            from sparkgnn.serving.online.http_front import HttpFront

            http = HttpFront(
                self,
                self.config.http,
                self.config.token,
                max_body_bytes=self.config.max_body_bytes,
                idle_timeout_s=self.config.http_idle_timeout_s,
                admin_token=self.config.admin_token,
                tls=(self.config.tls_cert, self.config.tls_key)
                if self.config.tls_cert and self.config.tls_key
                else None,
                parse_threads=self.config.parse_threads,
                parse_queue=self.config.parse_queue,
                metrics_auth=self.config.metrics_auth,
            ).start()
            self._http, self.http_url = http, http.url
        return self

    def _warm_up(self) -> None:
        """Each pool's workers load the deployment now, with a one-query request on a vertex of G,
        so the first client does not pay the load."""
        probe = probe_request(self.facts)
        header = self._batch_header(self._version, self.config.mode, [probe])
        tables = wire.batch_tables([probe])
        for pool in self.pools:
            pool.warm_up(header, tables)

    def _spawn(self, name: str, target, *args) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"sparkgnn-serve-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def stop(self) -> None:
        """Stop serving. Every request submitted gets an Outcome: queued ones, and batches handed
        to a pool but not started, are answered "stopping"; batches running finish (each thread
        is awaited up to 5 s). Then the fronts and the pools close."""
        self._stop.set()
        self._evict_wake.set()
        left = self.scheduler.close()  # wakes the batcher if it waits for a request
        self._dequeued(left)
        self._fail_stopped(left)  # queued, never started: answered, not dropped
        self._free.release()  # wakes the batcher if it waits for a slot
        if self._batcher is not None:
            self._batcher.join(timeout=5.0)  # no batch reaches a pool queue after this
        for p, q in enumerate(self._pool_queues):
            for _ in range(self.pools[p].width):  # one per dispatch thread of the pool
                q.put(None)
        if self._zmq is not None:
            self._zmq.wake()
        if self._http is not None:
            self._http.stop()  # type: ignore[attr-defined]  # an HttpFront
        for thread in self._threads:
            thread.join(timeout=5.0)
        for q in self._pool_queues:  # left by a dispatch thread still stuck in its call
            while True:
                try:
                    tickets = q.get_nowait()
                except queue.Empty:
                    break
                if tickets is not None:
                    self._fail_tickets(tickets, "stopping", "the service is stopping")
        for caller in self._callers.values():
            caller.shutdown(wait=False)
        for pool in self.pools:
            pool.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- intake -----------------------------------------------------------------------------
    def submit(
        self, request: Request, mode: str | None = None, deliver=None, *, deadline_ms: float | None = None
    ) -> Future:
        """Queue a request (in-process API; the ZeroMQ and HTTP fronts call this too). The
        Future resolves to an Outcome; validation errors, requests over the caps (size, cost) and
        BUSY (the queue's request count or byte budget, or a predicted completion past the
        request's deadline: `deadline_ms`, default the deployment's, admission.py) resolve it at
        once."""
        future: Future = Future()
        deliver = deliver or future.set_result
        mode = mode or self.config.mode
        with self._lock:
            self.stats["requests"] += 1
        if deadline_ms is not None and (
            isinstance(deadline_ms, bool)
            or not isinstance(deadline_ms, int | float)
            or not (math.isfinite(deadline_ms) and deadline_ms > 0)
        ):
            error = f"request {request.request_id!r}: deadline_ms must be a finite number > 0, got {deadline_ms!r}"
            self._finish(deliver, Outcome(request.request_id, "error", error=error), mode)
            return future
        facts = self.facts  # one version's facts for this request (a swap may replace them meanwhile)
        too_large = self.oversize(request)
        if too_large:
            self._finish(deliver, Outcome(request.request_id, "too_large", error=too_large), mode)
            return future
        problems = self._problems(request, mode, facts)
        if problems:
            self._finish(deliver, Outcome(request.request_id, "error", error=problems), mode)
            return future
        ticket = Ticket(request, mode, time.monotonic(), 0.0, deliver, nbytes=request_bytes(request))
        pending, ticket.psgs = facts.pending(request, ticket, mode, ticket.arrived)
        ticket.cost = pending.cost
        if pending.cost > self.config.max_cost:
            error = (
                f"request {request.request_id!r} has a predicted cost of {pending.cost:.0f} (the in-degree "
                f"sum its layers aggregate over); this service takes at most {self.config.max_cost:.0f} "
                "per request (split it)"
            )
            self._finish(deliver, Outcome(request.request_id, "too_large", error=error), mode)
            return future
        deadline_s = self.config.deadline_s(deadline_ms)
        estimate = self.admission.estimate(self.scheduler.backlog(), mode, pending.cost)
        refused = self.admission.refusal(estimate, deadline_s)
        if refused:
            with self._lock:
                self.stats["shed"] += 1
            self.metrics.shed(mode)
            retry = float(max(1, math.ceil(estimate.wait_s)))
            self._finish(deliver, Outcome(request.request_id, "busy", error=refused, retry_after_s=retry), mode)
            return future
        ticket.deadline = ticket.arrived + deadline_s
        with self._lock:
            over = self._queued_bytes + ticket.nbytes > self.config.queue_bytes and self._queued_bytes > 0
            if not over:
                self._queued_bytes += ticket.nbytes
        if over:
            error = (
                f"the queue holds {self._queued_bytes} bytes of requests; with this one's {ticket.nbytes} it "
                f"would pass its budget of {self.config.queue_bytes} bytes; retry later"
            )
            self._finish(deliver, Outcome(request.request_id, "busy", error=error), mode)
            return future
        try:
            self.scheduler.push(pending)
        except (QueueFull, SchedulerError) as exc:
            self._dequeued([pending])
            kind = "busy" if isinstance(exc, QueueFull) else "stopping"
            self._finish(deliver, Outcome(request.request_id, kind, error=str(exc)), mode)
        return future

    def _dequeued(self, pendings: list) -> None:
        """Requests left the scheduler's queue: their bytes leave its budget."""
        freed = sum(p.key.nbytes for p in pendings)
        with self._lock:
            self._queued_bytes -= freed

    def oversize(self, request: Request) -> str | None:
        """Why `request` is over this service's size limits (max_queries, max_edges), or None."""
        return over_caps(request, self.config.max_queries, self.config.max_edges)

    def _problems(self, request: Request, mode: str, facts: GraphFacts) -> str | None:
        if not isinstance(mode, str) or mode not in self.config.modes:
            return (
                f"mode {mode!r} is not served here (served: {', '.join(self.config.modes)}; a deployment "
                "serves the modes its config lists in `modes`)"
            )
        found = facts.problems(request)
        if found:
            return f"request {request.request_id!r} is invalid: " + "; ".join(found)
        return None

    def count_refusal(self) -> None:
        """A message a front could not even read as a request (it never reached submit)."""
        with self._lock:
            self.stats["requests"] += 1
            self.stats["errors"] += 1
        self.metrics.outcome(OTHER_MODE, "error")

    def metrics_state(self) -> dict:
        """What the scrape-time metrics read (stats.ServiceMetrics): queue, pools, version, cache."""
        with self._lock:
            busy = list(self._busy)
            state = {
                "queue_bytes": self._queued_bytes,
                "version": self._version.number,
                "graph_fingerprint": self._version.graph_fingerprint,
                "swaps": self.stats["swaps"],
                "batch_timeouts": self.stats["batch_timeouts"],
                "cache": self.cache_stats,
            }
        state["queue_requests"] = len(self.scheduler)
        state["pools"] = [
            {"name": pool.name, "slots": pool.width, "busy": busy[p], "workers": len(pool.worker_pids())}
            for p, pool in enumerate(self.pools)
        ]
        return state

    def _finish(self, deliver, outcome: Outcome, mode: str = "") -> None:
        """Count `outcome` (the stats, and the metrics by `mode`) and hand it to `deliver`."""
        with self._lock:
            key = {"ok": "answered", "busy": "busy", "too_large": "too_large"}.get(outcome.kind, "errors")
            self.stats[key] += 1
        answered = outcome.kind == "ok"
        self.metrics.outcome(mode, outcome.kind, outcome.queue_s + outcome.service_s if answered else None)
        deliver(outcome)

    # -- versions (module doc) ---------------------------------------------------------------
    def swap(self, graph: str, store: str | None = None, timeout_s: float = 300.0) -> dict:
        """Serve `graph` (a graph directory) with the PE store `store` (a store root, or a version
        folder; default: the root of the store served now) from the next batch on, without a
        restart: open and check the pair, load it on every worker (within `timeout_s`), then
        switch. Returns a report; raises SwapRefused saying why, the current version still
        serving. One swap at a time (a second waits)."""
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
                warmed, warm_errors = self._warm_version(old, new, timeout_s)
            except SwapRefused as exc:
                with self._lock:
                    self.stats["swaps_refused"] += 1
                    self._log_swap({"changed": False, "graph": graph, "store": store, "refused": str(exc)})
                raise
            with self._lock:  # the switch: every batch dispatched from here on takes `new`
                self._version, self.facts = new, new.facts
                self.config.graph, self.config.store = new.graph, new.store
                old.replaced = True
                in_flight = old.in_flight
                (self._draining if in_flight else self._evictions).append(old)
                self.stats["version"] = new.number
                self.stats["graph_fingerprint"] = new.graph_fingerprint
                self.stats["swaps"] += 1
                report = {
                    "changed": True,
                    **new.describe(),
                    "previous": old.describe(),
                    "previous_batches_in_flight": in_flight,
                    "warmed": warmed,
                    "warm_errors": warm_errors,
                    "seconds": round(time.monotonic() - started, 3),
                }
                self._log_swap(report)
        self._evict_wake.set()
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
            self.stats["swaps_refused"] += 1
            self._log_swap({"changed": False, "graph": graph, "store": store, "refused": why})
            number = self._version.number
        raise SwapRefused(f"swap refused: {why}; still serving version {number}")

    def _log_swap(self, entry: dict) -> None:
        self.swap_log.append(dict(entry, at=time.time()))
        del self.swap_log[:-100]  # bounded

    def _refusal(self, old: Version, graph: str, store: str | None, why: str) -> SwapRefused:
        return SwapRefused(
            f"swap to graph {graph} with PE store {store} refused: {why}; still serving version "
            f"{old.number} (graph {old.graph}, fingerprint {old.graph_fingerprint[:12] or 'unknown'})"
        )

    def _open_version(self, old: Version, graph: str, store: str | None) -> Version:
        """The new version as the front end holds it, after PEStore.open has checked that the
        store is this graph's and this model's (file sizes: each worker checks checksums when
        it loads the store)."""
        from sparkgnn.pe.store import PEStore

        try:
            opened = PEStore.open(store, model=self._model, graph=graph, verify="sizes") if store else None
            facts = GraphFacts.load(graph, opened, self._model.num_rounds)
            fingerprint = str(opened.manifest["graph_fingerprint"] if opened else fingerprint_of(graph))
        except Exception as exc:  # noqa: BLE001 - an operator's input: every failure is a refusal
            raise self._refusal(old, graph, store, f"{type(exc).__name__}: {exc}") from exc
        if facts.feature_dim != old.facts.feature_dim:
            raise self._refusal(
                old, graph, store, f"its features are {facts.feature_dim} wide, the model takes {old.facts.feature_dim}"
            )
        problems = deployment_problems(self.config.modes, self.config.mode_options, self.config.cache, opened)
        if problems:
            raise self._refusal(old, graph, store, problems)
        return Version(old.number + 1, graph, store, self.config.deployment(graph, store), facts, fingerprint)

    def _warm_version(self, old: Version, new: Version, timeout_s: float) -> tuple[dict, dict]:
        """Every worker of every pool loads `new` (and every served mode's engine) and answers a
        probe on it; ({pool: [pids]}, {mode: error} for modes whose engine could not be built).
        Refuses when a worker fails, the probe fails, or a worker is not reached in time; what
        some workers loaded is then dropped again (the evictor)."""
        probe = probe_request(new.facts)
        header = dict(self._batch_header(new, self.config.mode, [probe]), warm_modes=list(self.config.modes))
        for pool in self.pools:
            pool.register(new.spec)  # withdrawn again by the evictor if the swap is refused
        tables = wire.batch_tables([probe])
        deadline = time.monotonic() + timeout_s
        warmed: dict = {}
        warm_errors: dict = {}
        try:
            for pool in self.pools:
                try:
                    results, missing = pool.broadcast(header, tables, max(0.0, deadline - time.monotonic()))
                except Exception as exc:  # noqa: BLE001 - the worker's error, named in the refusal
                    raise self._refusal(
                        old, new.graph, new.store, f"a worker of pool {pool.name!r} failed to load it: {exc}"
                    ) from exc
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
                warmed[pool.name] = sorted(results)
            if warm_errors:  # a served mode would fail on every request after the switch
                broken = "; ".join(f"mode {m!r}: {e}" for m, e in sorted(warm_errors.items()))
                raise self._refusal(old, new.graph, new.store, f"it cannot serve every served mode ({broken})")
        except SwapRefused:
            with self._lock:
                new.replaced = True
                self._evictions.append(new)
            self._evict_wake.set()
            raise
        return warmed, warm_errors

    def _take_version(self) -> Version:
        with self._lock:
            version = self._version
            version.in_flight += 1
            return version

    def _release_version(self, version: Version) -> None:
        with self._lock:
            version.in_flight -= 1
            drained = version.replaced and not version.in_flight and version in self._draining
            if drained:
                self._draining.remove(version)
                self._evictions.append(version)
        if drained:
            self._evict_wake.set()

    def _evict_loop(self) -> None:
        while not self._stop.is_set():
            # woken by a drained version (or stop); with evictions left over, retried every second
            self._evict_wake.wait(1.0 if self._evictions else None)
            self._evict_wake.clear()  # before reading _evictions: a wake set after it is kept
            if self._evictions and not self._stop.is_set():
                self._evict_pass()

    def _evict_pass(self, timeout_s: float = 5.0) -> None:
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
                            self.stats["evicted"] += 1

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
            self._evict_wake.set()
            time.sleep(0.02)

    def version_info(self) -> dict:
        """The version served now, and replaced ones still draining or being dropped."""
        with self._lock:
            return {
                **self._version.describe(),
                "swaps": self.stats["swaps"],
                "draining": [{"version": v.number, "batches_in_flight": v.in_flight} for v in self._draining],
                "evicting": [v.number for v in self._evictions],
            }

    # -- batching and dispatch --------------------------------------------------------------
    def _batch_header(self, version: Version, mode: str, requests: list[Request]) -> dict:
        return {
            "op": BATCH_OP,
            "deployment": version.key,  # an id the pools registered: no path travels
            "mode": mode,
            "requests": [r.request_id for r in requests],
        }

    def _batch_loop(self) -> None:
        """Take a batch whenever a pool slot is free. Blocks while idle (no timeout polling):
        a dispatch thread's freed slot, a request, or stop() wakes it."""
        while True:
            self._free.acquire()
            if self._stop.is_set():
                return
            batch = self.scheduler.take(None)
            if not batch:  # the scheduler was closed: stopping
                return
            self._dequeued(batch)
            subs = divide(batch, self.config.t_s)
            for i, sub in enumerate(subs):
                # every sub-batch beyond the first waits for a slot of its own, AFTER the ones
                # before it are queued (with one slot, the first must run to free it)
                if i:
                    self._free.acquire()
                    if self._stop.is_set():
                        for rest in subs[i:]:
                            self._fail_stopped(rest)
                        return
                tickets: list[Ticket] = [p.key for p in sub]  # type: ignore[misc]  # keys are Tickets
                psgs = sum(t.psgs for t in tickets)
                self._pool_queues[self._choose_pool(psgs)].put(tickets)

    def _fail_tickets(self, tickets: list[Ticket], kind: str, error: str) -> None:
        for t in tickets:
            self._finish(t.deliver, Outcome(t.request.request_id, kind, error=error), t.mode)

    def _fail_stopped(self, sub: list) -> None:
        for pending in sub:
            ticket = pending.key
            self._finish(
                ticket.deliver,
                Outcome(ticket.request.request_id, "stopping", error="the service is stopping"),
                ticket.mode,
            )

    def _choose_pool(self, psgs: float) -> int:
        chosen = self.route(psgs, self.config.route_psgs, self.pools)
        with self._lock:
            if self._busy[chosen] + self._pool_queues[chosen].qsize() >= self.pools[chosen].width:
                idle = [i for i, p in enumerate(self.pools) if self._busy[i] + self._pool_queues[i].qsize() < p.width]
                if idle:
                    self.stats["overflow"] += 1
                    chosen = idle[0]
        return chosen

    def _dispatch_loop(self, p: int, slot: int) -> None:
        """Run the batches of pool `p`'s queue on `slot` until stop()'s sentinel (None) comes;
        a batch still queued once the service is stopping is answered "stopping"."""
        pool = self.pools[p]
        while True:
            tickets = self._pool_queues[p].get()
            if tickets is None:
                return
            with self._lock:
                self._busy[p] += 1
            try:
                if self._stop.is_set():
                    self._fail_tickets(tickets, "stopping", "the service is stopping")
                else:
                    self._run_batch(pool, slot, tickets)
            finally:
                with self._lock:
                    self._busy[p] -= 1
                self._free.release()

    def _late_batch(self, live: list[Ticket], call: Future) -> None:
        """A batch past its deadline: its requests are answered "timeout" now; the slot (and the
        batch's version) stays taken until the call returns, so a call that never ends holds one
        slot, never a growing number of threads."""
        with self._lock:
            self.stats["batch_timeouts"] += 1
        for t in live:
            self._finish(
                t.deliver,
                Outcome(
                    t.request.request_id,
                    "timeout",
                    error=f"its batch ran past the service's batch deadline of {self.config.batch_timeout_s:g} s",
                ),
                t.mode,
            )
        try:
            call.result()
        except Exception:  # noqa: BLE001, S110 - its requests were answered already
            pass

    def _run_batch(self, pool, slot: int, tickets: list[Ticket]) -> None:
        started = time.monotonic()
        live = []
        for t in tickets:
            if started > t.deadline and started - t.arrived <= self.config.request_timeout_s:
                self._finish(  # no use starting it: its client stopped waiting
                    t.deliver,
                    Outcome(
                        t.request.request_id,
                        "timeout",
                        error=f"request waited {(started - t.arrived) * 1e3:.0f} ms in the queue, past its "
                        f"deadline of {(t.deadline - t.arrived) * 1e3:.0f} ms",
                    ),
                )
            elif started - t.arrived > self.config.request_timeout_s:
                self._finish(
                    t.deliver,
                    Outcome(
                        t.request.request_id,
                        "timeout",
                        error=f"request waited {started - t.arrived:.1f} s in the queue, over the "
                        f"service's request timeout of {self.config.request_timeout_s} s",
                    ),
                    t.mode,
                )
            else:
                live.append(t)
        if not live:
            return
        requests = [t.request for t in live]
        version = self._take_version()  # the whole batch is answered by this version (module doc)
        try:
            header = self._batch_header(version, live[0].mode, requests)
            call = self._callers[(self.pools.index(pool), slot)].submit(
                pool.call, slot, header, wire.batch_tables(requests)
            )
            try:
                tables = call.result(timeout=self.config.batch_timeout_s)
            except FutureTimeout:
                self._late_batch(live, call)
                return
            meta = wire.read_meta(tables)
            answers = wire.split_answers(tables["answer"], len(live))
        except Exception as exc:  # noqa: BLE001 - a failed batch fails its requests, never the service
            for t in live:
                self._finish(
                    t.deliver,
                    Outcome(t.request.request_id, "failed", error=f"the batch failed: {type(exc).__name__}: {exc}"),
                    t.mode,
                )
            return
        finally:
            self._release_version(version)
        done = time.monotonic()
        service = done - started
        cost = sum(t.cost for t in live)
        self.service.observe(cost, service)
        self.admission.observe(live[0].mode, cost, service)
        if meta.get("cache") is not None:
            self.cache_stats = meta["cache"]
        self.metrics.batch(len(live))
        with self._lock:
            self.stats["batches"] += 1
            if len(self.batch_log) < 100_000:
                self.batch_log.append(
                    {
                        "requests": len(live),
                        "cost": cost,
                        "psgs": sum(t.psgs for t in live),
                        "pool": pool.name,
                        "seconds": service,
                    }
                )
        errors = meta.get("errors", {})
        for i, t in enumerate(live):
            error = errors.get(str(i))
            outcome = Outcome(
                t.request.request_id,
                "error" if error else "ok",
                answer=None if error else answers[i],
                error=error,
                queue_s=started - t.arrived,
                service_s=service,
                batch_requests=len(live),
                pool=pool.name,
                version=version.number,
            )
            self._finish(t.deliver, outcome, t.mode)
