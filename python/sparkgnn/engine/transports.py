"""How a Spark task reaches the DL engine, and how infer(workers=...) sets that up.

A transport spec is plain data (it travels inside the Spark closure):
  {"kind": "inprocess", "model_store": DIR}      the handler runs inside Spark's Python worker
  {"kind": "messenger", "endpoint": URL, ...}    a broker's front endpoint; standalone
                                                 `sparkgnn-worker`s run the layers (Spark tasks
                                                 then never import torch)
One transport per spec per process: handlers hold loaded models, dealers hold sockets.

`workers_for` refuses what cannot work before a job depends on it: an unknown or malformed spec
(WorkersSpecError listing the accepted forms), a tcp:// / ipc:// broker that does not answer or has
no worker (BrokerUnreachableError / NoWorkerError from the driver after the connect timeout); the
same timeouts travel to each task's dealer, so no network wait in a task is unbounded either.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from sparkgnn.errors import SparkGNNError

_CACHE: dict[str, object] = {}

# A layer step of a big partition can take minutes; a dead worker is detected by the broker's
# heartbeats (seconds), not by this timeout.
DEFAULT_MESSENGER_OPTIONS = {"timeout_s": 900.0, "retries": 3}


class InProcess:
    """Calls the DL handler directly, in this process."""

    def __init__(self, spec: dict):
        from sparkgnn.dl.handler import build_handler

        self.handler = build_handler(spec["model_store"], device=spec.get("device", "cpu"), threads=spec.get("threads", 1))

    def call(self, header: dict, tables: dict):
        return self.handler(header, tables)


class Messenger:
    """A dealer to the broker at spec["endpoint"]; the partition is the affinity key so the broker
    prefers the worker that served this partition before (per-partition caches stay warm)."""

    def __init__(self, spec: dict):
        from sparkgnn.messenger.transport import connect

        self.transport = connect(spec["endpoint"], **{**DEFAULT_MESSENGER_OPTIONS, **spec.get("options", {})})

    def call(self, header: dict, tables: dict):
        header = dict(header, affinity=f"{header.get('model')}:{header.get('partition')}")
        return self.transport.call(header, tables)


TRANSPORTS = {"inprocess": InProcess, "messenger": Messenger}


def get_transport(spec: dict):
    key = json.dumps(spec, sort_keys=True)
    transport = _CACHE.get(key)
    if transport is None:
        kind = spec.get("kind", "inprocess")
        if kind not in TRANSPORTS:
            raise WorkersSpecError(f"unknown transport kind {kind!r}; known: {sorted(TRANSPORTS)}")
        transport = _CACHE[key] = TRANSPORTS[kind](spec)
    return transport


@dataclass
class Workers:
    """What infer() runs the layers on: a transport spec plus, for local[N], the cluster it owns."""
    spec: dict
    cluster: object = None

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


class WorkersSpecError(SparkGNNError, ValueError):
    """`workers=` / `--workers` names no place the layers can run."""


ACCEPTED = ("inprocess (default: inside Spark's Python workers), local[N] (N >= 1 worker processes "
            "started for the job), tcp://host:port or ipc:///path (the --front endpoint of a running "
            "sparkgnn-broker), or a started LocalCluster")

# How long the driver waits for a broker to answer / to have a worker before starting a job on it,
# and how long each Spark task's dealer waits the same way. SPARKGNN_CONNECT_TIMEOUT_S overrides
# the default (the batch and streaming jobs have no flag for it); 0 waits without limit.
CONNECT_TIMEOUT_ENV = "SPARKGNN_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 15.0


def connect_timeout_s(value: float | None = None) -> float:
    """`value`, else SPARKGNN_CONNECT_TIMEOUT_S, else 15 s; a bad setting is a clear error."""
    if value is None:
        text = os.environ.get(CONNECT_TIMEOUT_ENV)
        if text is None:
            return DEFAULT_CONNECT_TIMEOUT_S
        try:
            value = float(text)
        except ValueError:
            raise WorkersSpecError(f"{CONNECT_TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise WorkersSpecError(f"connect timeout must be a finite number of seconds >= 0 (0 = no limit), got {value!r}")
    return float(value)


def _inprocess(workers, model_store: str, timeout_s: float) -> Workers:
    return Workers({"kind": "inprocess", "model_store": model_store})


def _local_count(workers: str) -> int:
    from sparkgnn.messenger.transport import parse_local

    try:
        return parse_local(workers)
    except ValueError as exc:
        raise WorkersSpecError(f"{exc}; accepted: {ACCEPTED}") from None


def _local(workers: str, model_store: str, timeout_s: float) -> Workers:
    from sparkgnn.messenger.local import LocalCluster

    cluster = LocalCluster(_local_count(workers), model_store=model_store, threads=1).start()
    return Workers({"kind": "messenger", "endpoint": cluster.front}, cluster)


def _check_endpoint(workers: str) -> str:
    from sparkgnn.messenger.endpoints import check_connect

    if workers.startswith("inproc://"):
        raise WorkersSpecError(f"workers={workers!r}: an inproc:// endpoint lives inside one process "
                               f"and Spark tasks run in others; accepted: {ACCEPTED}")
    try:
        return check_connect(workers)
    except ValueError:
        raise WorkersSpecError(f"bad workers endpoint {workers!r}: want tcp://host:port (a port "
                               f"1-65535) or ipc:///path; accepted: {ACCEPTED}") from None


def _endpoint(workers: str, model_store: str, timeout_s: float) -> Workers:
    """A running broker, checked from the driver before any Spark task depends on it: a wrong
    address or a broker without workers is one clear error here, not a hang (or one error per
    task, wrapped in a JVM stack trace) later."""
    from sparkgnn.messenger.dealer import probe_broker

    probe_broker(_check_endpoint(workers), connect_timeout_s=timeout_s, no_worker_timeout_s=timeout_s)
    options = {"connect_timeout_s": timeout_s, "no_worker_timeout_s": timeout_s}
    return Workers({"kind": "messenger", "endpoint": workers, "options": options})


def _cluster(cluster, model_store: str, timeout_s: float) -> Workers:
    """A LocalCluster the caller started (and stops): its workers must serve `model_store`."""
    return Workers({"kind": "messenger", "endpoint": cluster.front})


def _shape(workers) -> str | None:
    """Which builder a `workers` value is for, by its shape alone (the builder checks the rest,
    so `local[0]` is refused as a bad local spec, not as an unknown one)."""
    if workers is None or workers == "inprocess":
        return "inprocess"
    if hasattr(workers, "front") and hasattr(workers, "stop"):
        return "cluster"
    if not isinstance(workers, str):
        return None
    if workers.startswith("local"):
        return "local"
    if "://" in workers and workers.split("://", 1)[0] in ("tcp", "ipc", "inproc"):
        return "endpoint"
    return None


WORKER_SPECS = {"inprocess": _inprocess, "local": _local, "endpoint": _endpoint, "cluster": _cluster}
# shape -> the syntax check of its builder (nothing started, nothing probed)
SYNTAX = {"local": _local_count, "endpoint": _check_endpoint}


def check_workers(workers) -> None:
    """WorkersSpecError when `workers` is not a usable spec, without starting or probing
    anything: for callers to run before costly work (preparing the graph), so a typo in
    --workers fails in a second rather than after the Spark preparation."""
    shape = _shape(workers)
    if shape is None:
        raise WorkersSpecError(f"unknown workers spec {workers!r}; accepted: {ACCEPTED}")
    SYNTAX.get(shape, lambda _: None)(workers)


def workers_for(workers, model_store: str, *, connect_timeout: float | None = None) -> Workers:
    """infer(workers=...): "inprocess" (default), "local[N]" (starts a broker + N sparkgnn-worker
    processes, stopped when the job ends), "tcp://host:port" / "ipc://path" (a running broker whose
    workers load models from the same model store: checked at once, BrokerUnreachableError or
    NoWorkerError after `connect_timeout` seconds), or a started LocalCluster. Anything else is a
    WorkersSpecError listing the accepted forms."""
    check_workers(workers)
    return WORKER_SPECS[_shape(workers)](workers, model_store, connect_timeout_s(connect_timeout))
