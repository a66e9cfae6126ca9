"""sparkgnn.serving.online.server.Server: the long-running online service (docs/ARCHITECTURE.md
"Online serving"), a façade over the parts that do the work:

    clients --ZeroMQ (Arrow frames)--> intake --> scheduler (GSM) --> batcher --> router (Quiver)
            --HTTP/JSON (aiohttp)---->   |          degree order,      divider      PSGS -> pool
                                          |          T_d, aging                        |
            <------------------------ replies <-------- dispatch threads (one per pool slot)

  intake.py    Intake: a request checked and queued, or answered at once (caps, validation,
               admission, the queue's byte budget); Outcome, Ticket
  dispatch.py  Dispatcher: the batcher, the router, the dispatch threads, batch deadlines
  versions.py  VersionManager: the version served, swaps, batches in flight, eviction
  store_follow.py  StoreFollower: with `follow_store`, swaps to each version a follower publishes
  stats.py     ServiceMetrics (/metrics, the status line) and Tally (outcomes counted)
  zmq_front.py, http_front.py: the fronts, both into `submit`

WHY this shape:
  - The front end holds only GraphFacts (ids, in-degrees, PSGS: costs.py); the PE store lives in
    the pools' workers (pools.py, batch_op.py), so the front end's memory does not grow with the
    embeddings.
  - One scheduler queue for all requests, bounded (`capacity`): a full queue answers BUSY at once
    (back-pressure) instead of growing without limit; a request that cannot meet its deadline is
    refused at intake, BUSY with Retry-After (admission.py): past capacity the service answers at
    capacity instead of queueing seconds of work. Idle, no thread wakes (stop() wakes them).
  - Every resource is bounded and every wait has a timeout (intake.py, dispatch.py): an HTTP body
    and a ZeroMQ message at most `max_body_bytes`; the modes served are the config's `modes` (by
    default the cheap reuse modes), any other is refused naming that setting.
  - The deployment is checked as a whole before it serves and before a swap switches: every mode
    it serves (the default `mode` is always among them) must be answerable from its store (a store
    for HE, SRPE and EXACT; with states for SRPE, EXACT and auto; a "fap" metrics table for the
    fap hot cache), else it does not start / the swap is refused naming the mode
    (deployments.deployment_problems).
  - Nothing from the wire is unpickled: ZeroMQ messages are the messenger's frames (JSON header +
    Arrow tables, messenger.protocol), HTTP bodies are JSON. Binds are loopback unless told; a
    non-loopback ZeroMQ bind needs CURVE keys and a non-loopback HTTP bind needs a token and TLS.
  - One lock and one counters dict (`stats`) for the whole service, shared by its parts, so a
    snapshot (metrics_state, version_info) is consistent.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from sparkgnn.serving.online.admission import Admission
from sparkgnn.serving.online.batch_op import FUSABLE_MODES
from sparkgnn.serving.online.config import ServeConfig, split_http_bind
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.deployments import (
    SwapRefused,
    Version,
    deployment_problems,
    fingerprint_of,
    store_root,
)
from sparkgnn.serving.online.dispatch import BatchDeadline, Dispatcher
from sparkgnn.serving.online.intake import Intake, Outcome, Ticket, request_bytes
from sparkgnn.serving.online.pools import ServeError, make_pool
from sparkgnn.serving.online.scheduler import SCHEDULERS, ServiceModel
from sparkgnn.serving.online.sharded import check_budgets
from sparkgnn.serving.online.stats import ServiceMetrics, Tally, service_stats
from sparkgnn.serving.online.store_follow import StoreFollower
from sparkgnn.serving.online.versions import VersionManager
from sparkgnn.serving.request import Request

if TYPE_CHECKING:
    from sparkgnn.serving.online.typed_service import TypedServer

__all__ = ["BatchDeadline", "Outcome", "Server", "SwapRefused", "Ticket", "open_service", "request_bytes"]


def http_front_options(config: ServeConfig, parse_pool) -> dict[str, Any]:
    """HttpFront's settings from a deployment (token, limits, TLS, metrics access) and the
    service's parse pool, for both services (Server and the typed one)."""
    return {
        "token": config.token,
        "max_body_bytes": config.max_body_bytes,
        "idle_timeout_s": config.http_idle_timeout_s,
        "admin_token": config.admin_token,
        "tls": (config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None,
        "parse_pool": parse_pool,
        "metrics_auth": config.metrics_auth,
    }


def open_service(config: ServeConfig, *, start_pools: bool = True) -> Server | TypedServer:
    """The service of a deployment: a Server on a homogeneous graph, a TypedServer
    (typed_service.py) on a typed graph directory; a typed model on a homogeneous graph is
    refused in one line."""
    from sparkgnn.graph.typed_io import is_typed_graph_dir

    if is_typed_graph_dir(config.graph):
        from sparkgnn.serving.online.typed_service import TypedServer

        return TypedServer(config)
    from sparkgnn.models.hetero import is_typed_model_dir

    if is_typed_model_dir(config.model):
        raise ServeError(
            f"model {config.model} is a typed model (node and edge types) but graph {config.graph} is "
            "homogeneous: serve it on the typed graph it was converted for"
        )
    return Server(config, start_pools=start_pools)


class Server:
    """The online service of one deployment (`config`); `start_pools=False` builds it without
    worker pools (intake and scheduling only)."""

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
        model = Model.load(config.model)
        # the manifest and metrics tables only (file sizes checked; each worker checks checksums
        # when it loads the layers, which stay with the workers)
        store = PEStore.open(config.store, model=model, graph=config.graph, verify="sizes") if config.store else None
        problems = deployment_problems(config.modes, config.mode_options, config.cache, store)
        if problems:
            raise ServeError(f"deployment of graph {config.graph} with PE store {config.store}: {problems}")
        check_budgets(config, model, store)  # sharded pools' shards vs their memory budget, before any worker starts
        facts = GraphFacts.load(config.graph, store, model.num_rounds)
        fingerprint = fingerprint_of(config.graph, compute=False) or (store.manifest if store else {}).get(
            "graph_fingerprint"
        )
        first = Version(1, config.graph, config.store, config.deployment(), facts, fingerprint or "")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.stats: dict[str, Any] = service_stats(first.number, first.graph_fingerprint)
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
        # requests that cannot meet their deadline are refused at intake (admission.py)
        self.admission = Admission(
            max(1, sum(int(spec.get("width", 1)) for spec in config.pools)),
            config.t_d,
            {mode: self.scheduler.group_limit(mode) for mode in config.modes},
        )
        self.pools = []
        try:
            for spec in config.pools if start_pools else []:
                self.pools.append(make_pool(spec))
            for pool in self.pools:  # what the workers serve is registered, never sent (serving.served)
                pool.register(first.spec)
        except BaseException:  # a pool that cannot start: the ones started are stopped again
            for pool in self.pools:
                pool.close()
            raise
        self.metrics = ServiceMetrics(config.modes, self.metrics_state)  # /metrics, the status line
        self.tally = Tally(self.stats, self._lock, self.metrics)
        self.versions = VersionManager(
            config, model, self.pools, first, lock=self._lock, stats=self.stats, stop=self._stop
        )
        self.intake = Intake(config, self.scheduler, self.admission, lambda: self.facts, self.tally, self._lock)
        self.dispatcher = Dispatcher(
            config,
            self.pools,
            self.scheduler,
            self.versions,
            service=self.service,
            admission=self.admission,
            dequeued=self.intake.dequeued,
            tally=self.tally,
            lock=self._lock,
            stop=self._stop,
        )
        self._threads: list[threading.Thread] = []
        # swaps to each version a follower publishes under the store's root (store_follow.py)
        self.store_follower: StoreFollower | None = (
            StoreFollower(self.versions, str(store_root(config.store)), config.follow_interval_s, self._stop)
            if config.follow_store
            else None
        )
        self._zmq: Any = None  # the ZmqFront, once started
        self._parse_pool: Any = None  # the fronts' parsing threads (parsing.ParsePool), once started
        self.zmq_endpoint: str | None = None
        self.http_url: str | None = None
        self._http: object | None = None
        self._relay: Any = None  # the ZmqFront the front processes relay to (fronts.py), once started
        self.front_processes: Any = None  # fronts.FrontProcesses, when config.fronts > 1
        self._fronts_folder: str | None = None

    @property
    def facts(self) -> GraphFacts:
        """What the front end knows of the graph served now (the current version's)."""
        return self.versions.current.facts

    @property
    def batch_log(self) -> list[dict]:
        """Per batch served: requests, cost, psgs, pool, seconds (the first 100,000)."""
        return self.dispatcher.batch_log

    @property
    def cache_stats(self) -> dict | None:
        """The hot cache's hits, misses and hit rate, as the last batch reported them."""
        return self.dispatcher.cache_stats

    @property
    def swap_log(self) -> list[dict]:
        """The latest swaps asked for: reports, and refusals with their reason."""
        return self.versions.swap_log

    # -- lifecycle --------------------------------------------------------------------------
    def _check_binds(self) -> None:
        from sparkgnn.messenger.endpoints import check_bind, is_loopback

        if self.config.fronts > 1:
            from sparkgnn.serving.online import fronts

            why = fronts.reuse_port_refusal()
            if why:
                raise ServeError(f"fronts={self.config.fronts} needs SO_REUSEPORT to share the HTTP port, but {why}")

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
        """Load the deployment on every worker, start the threads and the fronts; returns self."""
        self.versions.warm_up()
        self.dispatcher.start(self._spawn)
        self._spawn("evictor", self.versions.evict_loop)
        if self.store_follower is not None:
            self._spawn("follow-store", self.store_follower.loop)
        from sparkgnn.serving.online.parsing import ParsePool
        from sparkgnn.serving.online.zmq_front import ZmqFront

        # both fronts decode and validate requests on these threads, never on their intake thread
        self._parse_pool = ParsePool(self.config.parse_threads, self.config.parse_queue)
        front = self._zmq = ZmqFront(self, self.config.bind, self.config.curve_keys, parse_pool=self._parse_pool)
        ready = threading.Event()
        self._spawn("intake", front.run, ready, self._stop)
        if not ready.wait(10.0):
            raise ServeError("the ZeroMQ intake did not start within 10 s")
        self.zmq_endpoint = front.endpoint
        if self.config.http:
            from sparkgnn.serving.online.http_front import HttpFront

            several = self.config.fronts > 1
            if several:
                from sparkgnn.serving.online.fronts import PROXY_NAME, fronts_folder

                self._fronts_folder = fronts_folder()
            http = HttpFront(
                self,
                self.config.http,
                **http_front_options(self.config, self._parse_pool),
                reuse_port=several,
                unix_path=os.path.join(self._fronts_folder, PROXY_NAME) if self._fronts_folder else None,
            ).start()
            self._http, self.http_url = http, http.url
            if several:
                self._start_front_processes(http)
        return self

    def _start_front_processes(self, http) -> None:
        """config.fronts - 1 HTTP front processes on the HTTP front's port (fronts.py), relaying to
        a ZmqFront on an ipc socket in the 0700 fronts folder."""
        from sparkgnn.serving.online.fronts import PROXY_NAME, RELAY_NAME, FrontProcesses, FrontSettings
        from sparkgnn.serving.online.zmq_front import ZmqFront

        folder = self._fronts_folder
        assert folder is not None
        relay = self._relay = ZmqFront(self, f"ipc://{folder}/{RELAY_NAME}", None, parse_pool=self._parse_pool)
        ready = threading.Event()
        self._spawn("relay", relay.run, ready, self._stop)
        if not ready.wait(10.0):
            raise ServeError("the front processes' relay did not start within 10 s")
        _scheme, address = http.url.split("://", 1)
        _host, port = split_http_bind(address)
        settings = [
            FrontSettings(
                index=i,
                host=http.host,
                port=port,
                relay=str(relay.endpoint),
                proxy=os.path.join(folder, PROXY_NAME),
                token=self.config.token,
                tls_cert=self.config.tls_cert,
                tls_key=self.config.tls_key,
                max_body_bytes=self.config.max_body_bytes,
                idle_timeout_s=self.config.http_idle_timeout_s,
                reply_timeout_s=self.config.request_timeout_s + self.config.batch_timeout_s + 5.0,
            )
            for i in range(1, self.config.fronts)
        ]
        self.front_processes = FrontProcesses(settings, stats=self.stats, lock=self._lock).start()

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
        self.versions.wake()
        left = self.scheduler.close()  # wakes the batcher if it waits for a request
        self.intake.dequeued(left)
        self.dispatcher.close_batcher(left)  # queued, never started: answered, not dropped
        if self.front_processes is not None:
            self.front_processes.stop()
        if self._zmq is not None:
            self._zmq.wake()
        if self._relay is not None:
            self._relay.wake()
        if self._http is not None:
            self._http.stop()  # type: ignore[attr-defined]  # an HttpFront
        if self._fronts_folder is not None:
            from sparkgnn.serving.online.fronts import remove_folder

            remove_folder(self._fronts_folder)
        for thread in self._threads:
            thread.join(timeout=5.0)
        if self._parse_pool is not None:
            self._parse_pool.shutdown()
        self.dispatcher.stop_dispatch()
        for pool in self.pools:
            pool.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- intake -----------------------------------------------------------------------------
    def submit(
        self,
        request: Request,
        mode: str | None = None,
        deliver=None,
        *,
        deadline_ms: float | None = None,
        received: float | None = None,
    ) -> Future:
        """Queue a request (in-process API; the ZeroMQ and HTTP fronts call this too). The
        Future resolves to an Outcome; validation errors, requests over the caps (size, cost) and
        BUSY (the queue's request count or byte budget, or a predicted completion past the
        request's deadline: `deadline_ms`, default the deployment's, counted from `received`,
        the time.monotonic() a front got it, else now; admission.py) resolve it at once
        (intake.Intake.submit)."""
        return self.intake.submit(request, mode, deliver, deadline_ms=deadline_ms, received=received)

    def refuse_early(
        self,
        request_id: str,
        mode: object,
        deliver,
        *,
        deadline_ms: object = None,
        ahead: int = 0,
        ahead_s: float = 0.0,
    ) -> bool:
        """Refuse BUSY from a request's header alone when the queue (and the `ahead` requests a
        front holds unparsed, `ahead_s` of parsing) already passes its deadline
        (Intake.refuse_early: a front's intake thread calls it before the body is parsed); True
        when refused, its Outcome handed to `deliver`."""
        return self.intake.refuse_early(
            request_id, mode, deliver, deadline_ms=deadline_ms, ahead=ahead, ahead_s=ahead_s
        )

    def oversize(self, request: Request) -> str | None:
        """Why `request` is over this service's size limits (max_queries, max_edges), or None."""
        return self.intake.oversize(request)

    def count_refusal(self) -> None:
        """A message a front could not even read as a request (it never reached submit)."""
        self.tally.refusal()

    def metrics_state(self) -> dict:
        """What the scrape-time metrics read (stats.ServiceMetrics): queue, pools, version, cache."""
        with self._lock:
            busy = list(self.dispatcher.busy)
            version = self.versions.current
            state = {
                "queue_bytes": self.intake.queued_bytes,
                "version": version.number,
                "graph_fingerprint": version.graph_fingerprint,
                "swaps": self.stats["swaps"],
                "batch_timeouts": self.stats["batch_timeouts"],
                "cache": self.dispatcher.cache_stats,
            }
        state["queue_requests"] = len(self.scheduler)
        state["pools"] = [
            {"name": pool.name, "slots": pool.width, "busy": busy[p], "workers": len(pool.worker_pids())}
            for p, pool in enumerate(self.pools)
        ]
        return state

    # -- versions (versions.py) -------------------------------------------------------------
    def swap(self, graph: str, store: str | None = None, timeout_s: float = 300.0) -> dict:
        """Serve `graph` (a graph directory) with the PE store `store` (a store root, or a version
        folder; default: the root of the store served now) from the next batch on, without a
        restart (VersionManager.swap). Returns a report; raises SwapRefused saying why, the
        current version still serving."""
        return self.versions.swap(graph, store, timeout_s)

    def check_swap_paths(self, graph: str, store: str | None) -> tuple[str, str | None]:
        """(graph, store) as a swap asked over the wire may open them (VersionManager.check_swap_paths)."""
        return self.versions.check_swap_paths(graph, store)

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait until every replaced version has drained and been dropped by every worker; False
        when some still is after timeout_s."""
        return self.versions.settle(timeout_s)

    def version_info(self) -> dict:
        """The version served now, and replaced ones still draining or being dropped."""
        return self.versions.info()
