"""TypedServer: the online service on a typed graph (docs/ARCHITECTURE.md "Online serving",
typed graphs). `sparkgnn-serve serve --graph TYPED_DIR --model TYPED_MODEL [--store TYPED_STORE]
--mode exact` (serving.online.server.open_service picks it for a typed graph directory) answers
typed requests over HTTP/JSON with serving.typed.TypedQueryEngine, one engine per served mode:

  POST /v1/answer  {"request_id"?, "mode"?, "deadline_ms"?,
                    "nodes": [{"type": "paper", "id": 1000, "x": [...]}, ...],
                    "edges"?: [{"relation": ["author", "writes", "paper"], "src": 7, "dst": 1000}, ...]}
                   (bodies.TypedAnswerBody; ids are per type, `x` omitted for a type without
                   features) -> 200 {"request_id", "status": "ok", "mode", "answers": [{"type",
                   "node", "h", "pred"?}], "queue_ms", "service_ms", "batch_requests", "pool",
                   "version"}: one answer per query of the model's output types, type by type in
                   the order the body first names them, request order within a type.

A request is refused with one line: 400 for a malformed body, a homogeneous body (nodes without
a type), a mode not served (the line names the typed modes served), and what the engine finds
wrong (unknown type or relation, width mismatch, ids naming vertices of G, endpoints that are
neither queries nor vertices, edges between two vertices of G); 413 over max_queries / max_edges;
503 with Retry-After when `capacity` requests already wait; 504 when one waited past its deadline
(`deadline_ms`, else the deployment's); 500 when answering failed. /metrics and /v1/health are
the homogeneous service's.

WHY its own service rather than the homogeneous Server's scheduler, pools and wire: those carry
one vertex type end to end (GSM's in-degree costs, the workers' stores, the Arrow answer frames),
and a typed answer differs per request in the types it holds. A typed deployment runs its engines
in this process, on `width` threads (the sum of its in-process pools' widths), each request
answered alone; the homogeneous path keeps its own code and costs nothing for this one.

Refused at start, one line each (ServeError): a mode that is not a typed mode (naming them),
pools of another kind than "inprocess" (workers, sharded), several HTTP front processes, a
followed store, a hot cache, and a deployment without the HTTP front (the ZeroMQ front's Arrow
frames carry homogeneous requests only, so a typed service does not open one). Not served yet:
/v1/score and /v1/topk (400 naming score_edges.py and topk.py), and swaps (409: restart the
service on the new graph and store).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgnn.errors import USER_ERRORS
from sparkgnn.serving.online.bodies import decode_typed_answer, typed_request_of
from sparkgnn.serving.online.config import ServeConfig, over_caps
from sparkgnn.serving.online.deployments import SwapRefused
from sparkgnn.serving.online.http_front import HttpFront, json_reply, outcome_response
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.online.stats import ServiceMetrics, Tally, service_stats
from sparkgnn.serving.typed import TYPED_MODES, TypedAnswer, TypedQueryEngine, TypedRequest

if TYPE_CHECKING:
    from sparkgnn.serving.online.parsing import ParsePool

log = logging.getLogger(__name__)

POOL_NAME = "typed"  # the pool label of a typed service's answers and metrics
NO_SWAP = "a typed service does not swap versions: restart it on the new graph and store"


@dataclass
class TypedOutcome:
    """What one typed request gets back, as intake.Outcome for a homogeneous one: `answer` (the
    engine's TypedAnswer) with `nodes`, the query ids per type in request order, or an error.
    kind: "ok", "error", "too_large", "busy", "timeout", "stopping", "failed" (Outcome's)."""

    request_id: str
    kind: str
    mode: str = ""
    answer: TypedAnswer | None = None
    nodes: dict[str, np.ndarray] = field(default_factory=dict)
    error: str | None = None
    queue_s: float = 0.0
    service_s: float = 0.0
    batch_requests: int = 0
    pool: str = ""
    version: int = 0
    retry_after_s: float | None = None


def typed_outcome_json(outcome: TypedOutcome) -> dict:
    """The HTTP/JSON form of a TypedOutcome (module doc): one answer per query of an output type,
    its `h` a numpy row (orjson writes it in C)."""
    body: dict = {"request_id": outcome.request_id, "status": outcome.kind}
    if outcome.error:
        body["error"] = outcome.error
    answer = outcome.answer
    if answer is not None:
        answers: list[dict] = []
        for node_type, h in answer.h.items():
            ids = outcome.nodes[node_type].tolist()
            rows = h.detach().cpu().numpy()
            if answer.pred is None:
                answers.extend({"type": node_type, "node": i, "h": row} for i, row in zip(ids, rows, strict=True))
            else:
                preds = answer.pred[node_type].tolist()
                answers.extend(
                    {"type": node_type, "node": i, "h": row, "pred": p}
                    for i, row, p in zip(ids, rows, preds, strict=True)
                )
        body.update(
            mode=outcome.mode,
            answers=answers,
            queue_ms=outcome.queue_s * 1e3,
            service_ms=outcome.service_s * 1e3,
            batch_requests=outcome.batch_requests,
            pool=outcome.pool,
            version=outcome.version,
        )
    return body


def typed_deployment_problems(config: ServeConfig) -> list[str]:
    """What a typed service cannot serve of `config` (module doc), one sentence each."""
    problems = []
    untyped = [m for m in config.modes if m not in TYPED_MODES]
    if untyped:
        problems.append(
            f"modes {untyped} are not typed serving modes; a typed graph is served in {', '.join(TYPED_MODES)} "
            "(give --mode and --modes among them)"
        )
    for spec in config.pools:
        if spec.get("kind", "inprocess") != "inprocess":
            problems.append(
                f"pool {spec.get('name')!r} is of kind {spec.get('kind')!r}; a typed service answers in its own "
                "process (pools of kind 'inprocess' only: drop --workers)"
            )
    if config.fronts > 1:
        problems.append(f"fronts={config.fronts}: a typed service runs one HTTP front")
    if config.follow_store:
        problems.append("follow_store: a typed store is refreshed one update at a time (restart on the new version)")
    if str((config.cache or {}).get("policy", "off")) != "off":
        problems.append("a hot cache: a typed service reads its store in process (cache policy 'off')")
    if not config.http:
        problems.append("no HTTP front (http): a typed service answers over HTTP/JSON only")
    return problems


class TypedServer:
    """The online service of a typed deployment (module doc): the HTTP front, one
    TypedQueryEngine per served mode, `width` answering threads. The HTTP front and
    `sparkgnn-serve` use it as they use Server (submit, stats, metrics, start/stop)."""

    def __init__(self, config: ServeConfig):
        from sparkgnn.graph.typed_io import read_typed_graph_dir
        from sparkgnn.models.hetero import HeteroModel, is_typed_model_dir
        from sparkgnn.pe.typed import TypedPEStore

        config.check()
        if config.mode not in config.modes:  # the default mode is served (requests naming none get it)
            config.modes = [*config.modes, config.mode]
        problems = typed_deployment_problems(config)
        if problems:
            raise ServeError(f"typed deployment of graph {config.graph}: " + "; ".join(problems))
        if not is_typed_model_dir(config.model):
            raise ServeError(
                f"graph {config.graph} is typed but model {config.model} is not a typed model: convert the "
                "PyG module with HeteroModel.from_pyg(module, metadata) and save it"
            )
        self.config = config
        graph = read_typed_graph_dir(config.graph)
        model = HeteroModel.load(config.model)
        store = TypedPEStore.open(config.store, model=model, graph=graph) if config.store else None
        options = config.mode_options or {}
        self.engines: dict[str, TypedQueryEngine] = {}
        for mode in config.modes:
            if mode != "full" and store is None:
                raise ServeError(
                    f"typed deployment of graph {config.graph}: mode {mode!r} reads a typed PE store, but no "
                    "store is given (--store)"
                )
            try:
                engine = TypedQueryEngine(graph, model, mode=mode, store=store, **options.get(mode, {}))
            except TypeError as exc:  # an option the mode does not take
                raise ServeError(f"typed deployment: mode {mode!r}: mode_options {options.get(mode)}: {exc}") from None
            self.engines[mode] = engine
        self.graph_fingerprint = graph.fingerprint
        self.width = max(1, sum(int(spec.get("width", 1)) for spec in config.pools))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._since = time.time()
        self.stats: dict[str, Any] = service_stats(1, self.graph_fingerprint)
        self.metrics = ServiceMetrics(config.modes, self.metrics_state)
        self.tally = Tally(self.stats, self._lock, self.metrics)
        self._queued = 0  # requests submitted and not started (guarded by _lock)
        self._queued_bytes = 0
        self._busy = 0
        self._executor: ThreadPoolExecutor | None = None
        self._parse_pool: ParsePool | None = None
        self._http: TypedHttpFront | None = None
        self.http_url: str | None = None
        self.zmq_endpoint: str | None = None  # no ZeroMQ front (module doc)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> TypedServer:
        """Start the answering threads and the HTTP front; returns self."""
        from sparkgnn.serving.online.parsing import ParsePool
        from sparkgnn.serving.online.server import http_front_options

        self._executor = ThreadPoolExecutor(self.width, thread_name_prefix="sparkgnn-serve-typed")
        self._parse_pool = ParsePool(self.config.parse_threads, self.config.parse_queue)
        assert self.config.http is not None  # typed_deployment_problems
        self._http = TypedHttpFront(self, self.config.http, **http_front_options(self.config, self._parse_pool))
        self._http.start()
        self.http_url = self._http.url
        return self

    def stop(self) -> None:
        """Stop serving: requests still queued are answered "stopping", running ones finish,
        then the front closes."""
        self._stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._http is not None:
            self._http.stop()
        if self._parse_pool is not None:
            self._parse_pool.shutdown()

    def __enter__(self) -> TypedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- requests ---------------------------------------------------------------------------
    def submit(
        self,
        request: TypedRequest,
        mode: str | None = None,
        deliver=None,
        *,
        deadline_ms: float | None = None,
        received: float | None = None,
    ) -> Future:
        """Queue a typed request; the Future resolves to its TypedOutcome (`deliver`, when given,
        gets it instead). A request that is not a TypedRequest, a mode not served, a bad
        deadline and a request over the caps or past the queue's capacity resolve it at once;
        the engine's refusals (TypedRequestError) come back as "error" when it is answered."""
        future: Future = Future()
        deliver = deliver or future.set_result
        mode = mode or self.config.mode
        request_id = str(getattr(request, "request_id", "request"))
        self.tally.add("requests")

        def refuse(kind: str, error: str) -> Future:
            self.tally.finish(deliver, TypedOutcome(request_id, kind, mode, error=error), mode)
            return future

        if not isinstance(request, TypedRequest):
            return refuse(
                "error",
                f"request {request_id!r}: this service serves a typed graph; send a TypedRequest "
                "(query nodes per node type, request edges per relation)",
            )
        if mode not in self.engines:
            return refuse(
                "error",
                f"mode {mode!r} is not served here (served: {', '.join(self.engines)}; typed serving modes: "
                f"{', '.join(TYPED_MODES)})",
            )
        if deadline_ms is not None and (
            isinstance(deadline_ms, bool)
            or not isinstance(deadline_ms, int | float)
            or not (math.isfinite(deadline_ms) and deadline_ms > 0)
        ):
            return refuse("error", f"request {request_id!r}: deadline_ms must be a finite number > 0")
        too_large = over_caps(request, self.config.max_queries, self.config.max_edges)
        if too_large:
            return refuse("too_large", too_large)
        nbytes = _request_bytes(request)
        with self._lock:
            full = self._queued >= self.config.capacity
            if not full:
                self._queued += 1
                self._queued_bytes += nbytes
        if full:
            return refuse("busy", f"{self.config.capacity} typed requests are queued already; retry later")
        now = time.monotonic()
        arrived = now if received is None else min(float(received), now)
        deadline = arrived + self.config.deadline_s(deadline_ms)
        try:
            assert self._executor is not None, "TypedServer.submit before start()"
            self._executor.submit(self._answer, request, mode, deliver, arrived, deadline, nbytes)
        except RuntimeError:  # shut down: the service is stopping
            self._dequeued(nbytes)
            return refuse("stopping", "the service is stopping")
        return future

    def _dequeued(self, nbytes: int) -> None:
        with self._lock:
            self._queued -= 1
            self._queued_bytes -= nbytes

    def _answer(self, request: TypedRequest, mode: str, deliver, arrived: float, deadline: float, nbytes: int) -> None:
        """On an answering thread: the request answered by its mode's engine, or refused."""
        self._dequeued(nbytes)
        started = time.monotonic()
        outcome = TypedOutcome(request.request_id, "ok", mode, queue_s=started - arrived, pool=POOL_NAME, version=1)
        if self._stop.is_set():
            outcome.kind, outcome.error = "stopping", "the service is stopping"
        elif started > deadline:
            outcome.kind = "timeout"
            outcome.error = f"request {request.request_id!r} waited {started - arrived:.3f} s, past its deadline"
        else:
            with self._lock:
                self._busy += 1
            try:
                outcome.answer = self.engines[mode].answer(request)
                outcome.nodes = {t: np.asarray(ids, np.int64).reshape(-1) for t, (ids, _x) in request.nodes.items()}
                outcome.batch_requests = 1
            except USER_ERRORS as exc:  # the engine's one-line refusals (TypedRequestError, ...)
                outcome.kind, outcome.error = "error", str(exc)
            except Exception as exc:  # noqa: BLE001 - answered "failed", logged with its traceback
                log.exception("sparkgnn-serve: typed request %r failed", request.request_id)
                outcome.kind, outcome.error = "failed", f"answering failed: {type(exc).__name__}: {exc}"
            finally:
                with self._lock:
                    self._busy -= 1
            outcome.service_s = time.monotonic() - started
            if outcome.kind == "ok":
                self.metrics.batch(1)
                self.tally.add("batches")
        self.tally.finish(deliver, outcome, mode)

    def count_refusal(self) -> None:
        """A body the front could not even read as a request (it never reached submit)."""
        self.tally.refusal()

    # -- what the fronts and the metrics read -----------------------------------------------
    def metrics_state(self) -> dict:
        """The scrape-time state of stats.ServiceMetrics: queue, the typed pool, the version."""
        with self._lock:
            queued, nbytes, busy = self._queued, self._queued_bytes, self._busy
        return {
            "queue_requests": queued,
            "queue_bytes": nbytes,
            "pools": [{"name": POOL_NAME, "slots": self.width, "busy": busy, "workers": 0}],
            "version": 1,
            "graph_fingerprint": self.graph_fingerprint,
            "swaps": 0,
            "batch_timeouts": 0,
            "cache": None,
        }

    def version_info(self) -> dict:
        """The version served (a typed service serves one, from start to stop)."""
        return {
            "version": 1,
            "graph": self.config.graph,
            "store": self.config.store,
            "graph_fingerprint": self.graph_fingerprint,
            "since": self._since,
            "swaps": 0,
            "draining": [],
            "evicting": [],
        }

    def check_swap_paths(self, graph: str, store: str | None) -> tuple[str, str | None]:
        """Swaps are not served on a typed graph: SwapRefused (HTTP 409)."""
        raise SwapRefused(NO_SWAP)

    def swap(self, graph: str, store: str | None = None, timeout_s: float = 300.0) -> dict:
        """Swaps are not served on a typed graph: SwapRefused."""
        raise SwapRefused(NO_SWAP)


def _request_bytes(request: TypedRequest) -> int:
    """The bytes of a typed request's ids, features and edges (what it holds while queued)."""
    total = 0
    for ids, x in request.nodes.values():
        total += np.asarray(ids).nbytes + (0 if x is None else np.asarray(x).nbytes)
    for src, dst in request.edges.values():
        total += np.asarray(src).nbytes + np.asarray(dst).nbytes
    return int(total)


def _typed_response(outcome: TypedOutcome):
    return outcome_response(outcome, typed_outcome_json)


class TypedHttpFront(HttpFront):
    """The HTTP front of a TypedServer: typed answer bodies (bodies.TypedAnswerBody) in, typed
    answers out; /v1/score and /v1/topk refused (module doc)."""

    def __init__(self, server: TypedServer, bind: str, **options):
        super().__init__(server, bind, **options)
        self.respond = _typed_response

    def _parse_and_submit(self, body: bytes):
        """On a parse thread: decode a typed body, then TypedServer.submit; its Outcome's Future."""
        parsed = decode_typed_answer(body)
        return self.server.submit(typed_request_of(parsed), parsed.mode, deadline_ms=parsed.deadline_ms)

    async def _link(self, op: str, request):
        if not self._authorised(request):
            return json_reply({"status": "error", "error": "missing or wrong bearer token"}, status=401)
        self.server.count_refusal()
        error = (
            f"/v1/{op} is not served on a typed graph yet: score typed pairs with spark_jobs/score_edges.py "
            "and rank them with spark_jobs/topk.py"
        )
        return json_reply({"status": "error", "error": error}, status=400)


__all__ = ["TypedHttpFront", "TypedOutcome", "TypedServer", "typed_deployment_problems", "typed_outcome_json"]
