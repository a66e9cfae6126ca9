"""The streaming job: start-up checks, the Structured Streaming query, and its run loop.

Start-up order (cheap refusals before the ~10 s SparkSession start):
  1. the mode is known (serving.modes.MODES) and its options are accepted (the registry says);
  2. G is read from --graph, the model loaded, the PE store opened and VERIFIED against both
     (PEStore.open raises StalePEStore naming what differs); modes other than full/ns need one;
  3. ONE QueryEngine is built (and warmed up with one synthetic request, so the first real
     request does not pay for loading the store's layers); every micro-batch reuses it;
  4. the output directory is checked against the checkpoint (sink.py: one output per checkpoint);
  5. only then the SparkSession and the query.

A typed graph or model (engine.typed.is_typed_source) gets ONE TypedQueryEngine instead
(build_typed_engine: serving.typed.TYPED_MODES, in process; a typed PE store for all but full), and the
handler reads typed request files (serving/typed_request.py).

Source: Spark's `binaryFile` file source over the request directory (path, modificationTime,
content per file; the schema must be given for a stream). Files are picked up by name glob
(*.parquet); hidden and temp names (leading '.' or '_') are never listed, which is why request
files are written to a hidden temp name and renamed into place (serving.request.write_requests).
`max_files_per_trigger` is Spark's maxFilesPerTrigger (oldest files first; default
DEFAULT_MAX_FILES_PER_TRIGGER, so a backlog of thousands of files never lands in one micro-batch);
a request file holds whole requests, so with one request per file (what the workload writer
produces) it is also the maximum number of requests per micro-batch. Each file is bounded too
(`max_file_bytes`, `max_file_rows`, `max_file_decompressed_bytes`: intake.FileLimits; an oversize
file is dead-lettered before it is collected to the driver), and each request by the online
service's caps (`max_queries`, `max_edges`: an error row), so one micro-batch holds at most
max_files_per_trigger x max_file_bytes of content on the driver. Spark leaves 0-byte files out of the micro-batch's
DataFrame although the source consumed them; the handler finds them in the checkpoint's source
log (sourcelog.py) and dead-letters them, so every consumed file is answered or refused.

Sink: foreachBatch(MicroBatchHandler) with the atomic, idempotent per-batch-id directory writes of
sink.py; together with the checkpoint's offset and commit logs that is exactly-once output per
request file (sink.py explains the argument).

Spark Connect (a session from SparkSession.builder.remote, or SPARK_REMOTE): foreachBatch pickles
the handler, with its QueryEngine, and runs it in a Python process of the Connect server, so the
handler's counters and log lines stay there (they go to the `sparkgnn.streaming` logger of the
server's Python process). The run loop then follows the sink instead (follow.SinkFollower: the
batches written since start, with the same progress lines). `--workers spark` works (the CGP
executor, once on the server, runs its tasks through the session of the micro-batch); messenger
workers (local[N], tcp://, ipc://) are refused, since their connections cannot move into the
server's process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkgnn.errors import SparkGNNError

log = logging.getLogger(__name__)
STORELESS_MODES = ("full", "ns")
DEFAULT_MAX_FILES_PER_TRIGGER = 64
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


class StreamStartError(SparkGNNError):
    """The streaming job refuses to start (missing store for a reuse mode)."""


class StreamJobError(SparkGNNError):
    """The streaming query stopped with an error."""


@dataclass
class StreamConfig:
    graph: str
    model: str
    requests: str
    out: str
    checkpoint: str
    store: str | None = None
    mode: str = "full"
    mode_options: dict = field(default_factory=dict)
    workers: str = "inprocess"  # inprocess | spark (reuse modes: CGP as Spark tasks) | other: to the mode
    engine: str | None = None  # serve://tcp://HOST:PORT: a running sparkgnn-serve answers the requests
    grouping: str = "degree"
    grouping_options: dict = field(default_factory=dict)
    trigger_s: float | None = None  # None or 0: next micro-batch right after the last
    available_now: bool = False  # process what is there, then stop (tests, backfill)
    max_files_per_trigger: int | None = DEFAULT_MAX_FILES_PER_TRIGGER  # None: the default too
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_rows: int = 1_000_000
    max_file_decompressed_bytes: int = 256 * 1024 * 1024
    max_queries: int = 4096
    max_edges: int = 131072
    dead_letter: str | None = None  # default <out>/_dead_letter
    glob: str = "*.parquet"
    max_batches: int | None = None
    timeout_s: float | None = None
    seed: int = 0
    warmup: bool = True

    @property
    def dead_letter_dir(self) -> str:
        return self.dead_letter or os.path.join(self.out, "_dead_letter")

    def file_limits(self):
        """The per-file and per-request caps (intake.FileLimits; ValueError naming a bad one)."""
        from sparkgnn.streaming.intake import FileLimits

        return FileLimits(
            max_bytes=self.max_file_bytes,
            max_rows=self.max_file_rows,
            max_decompressed_bytes=self.max_file_decompressed_bytes,
            max_queries=self.max_queries,
            max_edges=self.max_edges,
        )


@dataclass
class RunResult:
    query_id: str
    batches: int  # micro-batches handled by this run
    last_batch_id: int | None
    history: list  # progress.BatchProgress per micro-batch
    stopped_by: str  # finished | max_batches | timeout | signal | stop_when


def build_engine(cfg: StreamConfig):
    """Steps 1-3 of the module doc. Returns (graph G, QueryEngine), or on a typed graph or model
    (TypedGraphData G, TypedQueryEngine): build_typed_engine."""
    from sparkgnn.graph import read_graph_dir
    from sparkgnn.models import Model
    from sparkgnn.pe import PEStore
    from sparkgnn.serving import MODES, QueryEngine

    MODES.lookup(cfg.mode)  # an unknown mode is a ModeError naming the known ones
    from sparkgnn.engine.typed import is_typed_source

    if is_typed_source(cfg.graph) or is_typed_source(cfg.model):
        return build_typed_engine(cfg)
    if cfg.store is None and cfg.mode not in STORELESS_MODES:
        raise StreamStartError(
            f"mode {cfg.mode!r} reuses precomputed embeddings: --store is required "
            f"(only {', '.join(STORELESS_MODES)} run without a PE store)"
        )
    started = time.perf_counter()
    graph = read_graph_dir(cfg.graph)
    if cfg.engine:
        from sparkgnn.serving.online.remote_engine import RemoteEngine

        log.info(f"stream: requests are answered by the service at {cfg.engine} (mode {cfg.mode})")
        return graph, RemoteEngine(cfg.engine, cfg.mode)
    model = Model.load(cfg.model)
    store = PEStore.open(cfg.store, model=model, graph=graph) if cfg.store else None
    options = dict(cfg.mode_options)
    remote = cfg.workers not in (None, "", "inprocess")
    if remote and cfg.mode in STORELESS_MODES:
        raise StreamStartError(
            f"--workers {cfg.workers} runs the CGP partitions of a reuse mode (he, "
            f"srpe, exact); mode {cfg.mode!r} has none"
        )
    engine = QueryEngine(graph, model, mode=cfg.mode, store=store, seed=cfg.seed, **options)
    if remote and cfg.workers != "spark":  # local[N] / tcp:// / ipc://: messenger workers
        from sparkgnn.serving.spark_cgp import use_messenger_cgp

        use_messenger_cgp(
            engine,
            cfg.workers,
            cfg.graph,
            cfg.model,
            model_store=os.path.join(os.path.abspath(cfg.checkpoint), "_worker_models"),
        )
        log.info(
            f"stream: each request's layers run as {engine.mode.partitions} partitions on messenger "
            f"workers {cfg.workers}"
        )
    if cfg.warmup:
        engine.answer(warmup_request(graph))
    log.info(
        f"stream: engine ready in {time.perf_counter() - started:.1f} s: mode {engine.mode_name}"
        f"{' ' + json.dumps(options, sort_keys=True) if options else ''}, G {graph.num_nodes} vertices / "
        f"{len(graph.edge_src)} edges{', store ' + cfg.store if cfg.store else ''}"
    )
    return graph, engine


def build_typed_engine(cfg: StreamConfig):
    """Steps 1-3 of the module doc on a typed graph or model: (TypedGraphData G, ONE
    TypedQueryEngine). The modes in TYPED_MODES with the options each takes (check_typed_mode),
    in process; what else the job offers homogeneous graphs (other modes, CGP workers, a remote
    service) is refused in one line, before anything is loaded."""
    from sparkgnn.graph.typed_io import read_typed_graph_dir
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.pe.typed import TypedPEStore
    from sparkgnn.serving.typed import TYPED_MODES, TypedQueryEngine, check_typed_mode

    modes = ", ".join(TYPED_MODES)
    if cfg.mode not in TYPED_MODES:
        raise StreamStartError(f"a typed graph is served in modes {modes}, not {cfg.mode!r}")
    options = {"seed": cfg.seed, **cfg.mode_options}
    try:
        check_typed_mode(cfg.mode, options)
    except SparkGNNError as exc:
        raise StreamStartError(str(exc)) from None
    refused = [
        what
        for what, given in (
            (f"--workers {cfg.workers}", cfg.workers not in (None, "", "inprocess")),
            (f"--engine {cfg.engine}", cfg.engine),
        )
        if given
    ]
    if refused:
        raise StreamStartError(
            f"a typed graph is served in process in modes {modes}, which take none of: {', '.join(refused)}"
        )
    if cfg.mode != "full" and cfg.store is None:
        raise StreamStartError(
            f"mode {cfg.mode!r} reuses precomputed embeddings: --store is required (a typed PE store)"
        )
    started = time.perf_counter()
    graph = read_typed_graph_dir(cfg.graph)
    model = HeteroModel.load(cfg.model)
    store = TypedPEStore.open(cfg.store, model=model, graph=graph) if cfg.mode != "full" else None
    engine = TypedQueryEngine(graph, model, mode=cfg.mode, store=store, **options)
    if cfg.warmup:
        engine.answer(typed_warmup_request(graph, model))
    log.info(
        f"stream: typed engine ready in {time.perf_counter() - started:.1f} s: mode {engine.mode_name}, G "
        f"{len(graph.node_types)} node types / {len(graph.edge_types)} relations, {graph.num_nodes} vertices / "
        f"{graph.num_edges} edges{f', store {cfg.store}' if store is not None else ''}"
    )
    return graph, engine


def typed_warmup_request(graph, model):
    """warmup_request on a typed graph: one query of the model's first output type (an id its type
    does not have, zero features) with one in-edge from a vertex of G, through the first relation
    into that type that has a source vertex; output discarded."""
    import numpy as np

    from sparkgnn.serving.typed import TypedRequest

    node_type = next(t for t in model.outputs if t in graph.nodes)
    table = graph.nodes[node_type]
    q = int(table.ids.max()) + 1 if table.num_nodes else 0
    x = np.zeros((1, table.feature_dim), np.float32) if table.feature_dim else None
    edges = {}
    for et in graph.edge_types:
        if et[2] == node_type and graph.nodes[et[0]].num_nodes:
            edges[et] = (graph.nodes[et[0]].ids[:1].copy(), np.array([q]))
            break
    return TypedRequest({node_type: (np.array([q]), x)}, edges, request_id="__warmup__")


def warmup_request(graph):
    """One query (an id G does not have) with zero features and one in-edge from G's first
    vertex: exercises the whole answer path once, output discarded."""
    import numpy as np

    from sparkgnn.serving import Request

    q = int(graph.ids.max()) + 1 if graph.num_nodes else 0
    return Request(
        "__warmup__",
        np.array([q]),
        np.zeros((1, graph.feature_dim), np.float32),
        graph.ids[:1].copy(),
        np.array([q])[: min(1, graph.num_nodes)],
    )


def checkpoint_query_id(checkpoint: str) -> str | None:
    """The query id Spark keeps in <checkpoint>/metadata, None for a fresh checkpoint."""
    path = os.path.join(checkpoint, "metadata")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh).get("id")


def start_query(spark, cfg: StreamConfig, handler):
    """The streaming query: binaryFile source over cfg.requests -> foreachBatch(handler)."""
    reader = spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA).option("pathGlobFilter", cfg.glob)
    reader = reader.option("maxFilesPerTrigger", int(cfg.max_files_per_trigger or DEFAULT_MAX_FILES_PER_TRIGGER))
    df = reader.load(os.path.abspath(cfg.requests))
    writer = df.writeStream.foreachBatch(handler).option("checkpointLocation", os.path.abspath(cfg.checkpoint))
    if cfg.available_now:
        writer = writer.trigger(availableNow=True)
    elif cfg.trigger_s:
        writer = writer.trigger(processingTime=f"{float(cfg.trigger_s)} seconds")
    return writer.start()


class InServerProcess:
    """The foreachBatch function of a Spark Connect query: the handler, pickled with the torch
    thread count of this process (--torch-threads), which it sets in the server's Python process
    before each micro-batch, so answers are computed as they would be here."""

    def __init__(self, handler):
        import sys

        torch = sys.modules.get("torch")
        self.handler = handler
        self.torch_threads = torch.get_num_threads() if torch is not None else None

    def __call__(self, df, batch_id) -> None:
        if self.torch_threads:
            import torch

            if torch.get_num_threads() != self.torch_threads:
                torch.set_num_threads(self.torch_threads)
        self.handler(df, batch_id)


def _last_committed(query) -> int | None:
    progress = query.lastProgress
    if progress is None:
        return None
    try:
        return int(progress["batchId"])
    except (TypeError, KeyError):
        return int(progress.batchId)


def run(
    cfg: StreamConfig,
    spark,
    handle_signals: bool = False,
    on_started: Callable | None = None,
    stop_when: Callable | None = None,
    engine=None,
) -> RunResult:
    """Start the job and run it until the source is exhausted (available_now), max_batches
    micro-batches are committed, timeout_s passes, SIGTERM/SIGINT (handle_signals) or
    stop_when(handler) is true after a committed micro-batch (benchmarks).
    `spark`: a SparkSession, or a zero-argument callable returning one (called after the engine
    checks, so a refusal does not wait for Spark). `engine`: a (graph, QueryEngine) pair built by
    build_engine, to share one across runs (benchmarks); default: built from cfg."""
    from sparkgnn.streaming.grouping import get_grouping

    grouping = get_grouping(cfg.grouping, **cfg.grouping_options)
    owns_engine = engine is None
    graph, engine = engine if engine is not None else build_engine(cfg)
    try:
        return _run_with(cfg, graph, engine, spark, on_started, stop_when, handle_signals, grouping)
    finally:
        executor = getattr(getattr(engine, "mode", None), "executor", None) if owns_engine else None
        close = getattr(executor, "close", None)
        if close is not None:
            close()  # stops local[N] messenger workers


def _run_with(cfg, graph, engine, spark, on_started, stop_when, handle_signals, grouping):
    from sparkgnn.deadletter import DeadLetter
    from sparkgnn.engine.spark_compat import is_connect
    from sparkgnn.streaming.follow import SinkFollower
    from sparkgnn.streaming.handler import MicroBatchHandler
    from sparkgnn.streaming.sink import AnswerSink

    sink = AnswerSink(cfg.out)
    sink.check_binding(checkpoint_query_id(cfg.checkpoint), cfg.checkpoint)
    sink.sweep()
    dead = DeadLetter(cfg.dead_letter_dir)
    os.makedirs(cfg.requests, exist_ok=True)

    session = spark() if callable(spark) else spark
    remote_handler = is_connect(session)  # foreachBatch runs the handler in the server's process
    if remote_handler and cfg.workers not in (None, "", "inprocess", "spark"):
        raise StreamStartError(
            f"--workers {cfg.workers}: messenger workers cannot serve a Spark Connect session (the "
            f"micro-batch handler runs in the Connect server's Python process, where this process's "
            f"worker connections do not exist); use --workers spark or inprocess"
        )
    handler = MicroBatchHandler(
        engine,
        graph,
        grouping,
        sink,
        dead,
        checkpoint=os.path.abspath(cfg.checkpoint),
        limits=cfg.file_limits(),
    )
    # what the loop reads of the handler: itself, or (Connect) what it wrote to the sink
    view = SinkFollower(cfg.out) if remote_handler else handler
    batch_fn = InServerProcess(handler) if remote_handler else handler
    if cfg.workers == "spark":
        from sparkgnn.serving.spark_cgp import use_spark_cgp

        parts = cfg.mode_options.get("partitions") or engine.mode.partitions
        use_spark_cgp(engine, session, cfg.graph, cfg.model, partitions=parts)
        log.info(f"stream: each request's layers run as {parts} Spark tasks (CGP over the cached PE store)")
    query = start_query(session, cfg, batch_fn)
    sink.bind(query.id, cfg.checkpoint)
    log.info(
        f"stream: query {query.id} watching {os.path.abspath(cfg.requests)} -> {sink.out} "
        f"(checkpoint {os.path.abspath(cfg.checkpoint)}, grouping {json.dumps(grouping.describe())})"
    )
    if on_started:
        on_started(query, view)

    stop = threading.Event()
    previous = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    deadline = None if not cfg.timeout_s else time.monotonic() + float(cfg.timeout_s)
    stopped_by = "finished"
    try:
        while True:
            try:
                if query.awaitTermination(0.2):
                    break
            except Exception:  # the query died; query.exception() below says why
                break
            if stop.is_set():
                stopped_by = "signal"
                break
            if isinstance(view, SinkFollower):
                view.poll()
            last = _last_committed(query)  # progress is reported after the commit log entry
            handled = view.last_batch_id if view.batches_handled else None
            committed = handled is not None and last is not None and last >= handled
            if cfg.max_batches and view.batches_handled >= cfg.max_batches and committed:
                stopped_by = "max_batches"
                break
            if stop_when is not None and committed and stop_when(view):
                stopped_by = "stop_when"
                break
            if deadline is not None and time.monotonic() > deadline:
                stopped_by = "timeout"
                break
    finally:
        if query.isActive:
            query.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
    if isinstance(view, SinkFollower):
        view.poll()  # batches written after the loop's last look
    exc = query.exception()
    if exc is not None:
        raise StreamJobError(f"streaming query {query.id} failed: {exc}")
    log.info(f"stream: stopped ({stopped_by}) after {view.batches_handled} micro-batches in this run")
    return RunResult(str(query.id), view.batches_handled, view.last_batch_id, view.history, stopped_by)
