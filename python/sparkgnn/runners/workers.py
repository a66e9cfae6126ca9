"""`infer(workers=...)` / `--workers`: which place runs the DL steps, checked and set up.

`workers_for` refuses what cannot work before a job depends on it: an unknown or malformed spec
(WorkersSpecError listing the accepted forms), a tcp:// / ipc:// broker that does not answer or has
no worker (BrokerUnreachableError / NoWorkerError from the driver after the connect timeout); the
same timeouts travel to each task's dealer (transports.py), so no network wait in a task is
unbounded either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry

if TYPE_CHECKING:
    from sparkgnn.messenger.local import LocalCluster


@dataclass
class Workers:
    """What infer() runs the layers on: a transport spec plus, for local[N], the cluster it owns."""

    spec: dict
    cluster: LocalCluster | None = None

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


class WorkersSpecError(SparkGNNError, ValueError):
    """`workers=` / `--workers` names no place the layers can run."""


ACCEPTED = (
    "inprocess (default: inside Spark's Python workers), local[N] (N >= 1 worker processes "
    "started for the job), tcp://host:port or ipc:///path (the --front endpoint of a running "
    "sparkgnn-broker), or a started LocalCluster"
)

# How long the driver waits for a broker to answer / to have a worker before starting a job on it,
# and how long each Spark task's dealer waits the same way. SPARKGNN_CONNECT_TIMEOUT_S overrides
# the default (the batch and streaming jobs have no flag for it); 0 waits without limit.
CONNECT_TIMEOUT_ENV = "SPARKGNN_CONNECT_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 15.0

# shape -> the builder of its Workers (after check_workers)
WORKER_SPECS: Registry = Registry("workers spec shape", WorkersSpecError)
# shape -> the syntax check of its builder (nothing started, nothing probed)
SYNTAX: Registry = Registry("workers spec syntax", WorkersSpecError)


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


@WORKER_SPECS.register("inprocess")
def _inprocess(workers, model_store: str, timeout_s: float, deployments: str | None = None) -> Workers:
    return Workers({"kind": "inprocess", "model_store": model_store})


@SYNTAX.register("local")
def _local_count(workers: str) -> int:
    from sparkgnn.messenger.transport import parse_local

    try:
        return parse_local(workers)
    except ValueError as exc:
        raise WorkersSpecError(f"{exc}; accepted: {ACCEPTED}") from None


@WORKER_SPECS.register("local")
def _local(workers: str, model_store: str, timeout_s: float, deployments: str | None = None) -> Workers:
    """local[N]: N worker processes started for the job; `deployments`: the file of what their
    serving ops serve (sparkgnn.serving.served), passed as `--deployments`."""
    from sparkgnn.messenger.local import LocalCluster

    cluster = LocalCluster(_local_count(workers), model_store=model_store, deployments=deployments, threads=1).start()
    return Workers(_cluster_spec(cluster), cluster)


@SYNTAX.register("endpoint")
def _check_endpoint(workers: str) -> str:
    from sparkgnn.messenger.endpoints import check_connect

    if workers.startswith("inproc://"):
        raise WorkersSpecError(
            f"workers={workers!r}: an inproc:// endpoint lives inside one process "
            f"and Spark tasks run in others; accepted: {ACCEPTED}"
        )
    try:
        return check_connect(workers)
    except ValueError:
        raise WorkersSpecError(
            f"bad workers endpoint {workers!r}: want tcp://host:port (a port "
            f"1-65535) or ipc:///path; accepted: {ACCEPTED}"
        ) from None


@WORKER_SPECS.register("endpoint")
def _endpoint(workers: str, model_store: str, timeout_s: float, deployments: str | None = None) -> Workers:
    """A running broker, checked from the driver before any Spark task depends on it: a wrong
    address or a broker without workers is one clear error here, not a hang (or one error per
    task, wrapped in a JVM stack trace) later."""
    from sparkgnn.messenger.probe import probe_broker
    from sparkgnn.messenger.security import KEYS_ENV, client_keys_for

    # a keyed broker: the driver's $SPARKGNN_CURVE_KEYS folder (client.key_secret + server.key),
    # which each task's dealer reads at the same path (the executors' hosts need it there too)
    keys_dir = os.environ.get(KEYS_ENV) or None
    probe_broker(
        _check_endpoint(workers),
        connect_timeout_s=timeout_s,
        no_worker_timeout_s=timeout_s,
        client_keys=client_keys_for(keys_dir),
    )
    options: dict[str, float | str] = {"connect_timeout_s": timeout_s, "no_worker_timeout_s": timeout_s}
    if keys_dir:
        options["keys_dir"] = keys_dir
    return Workers({"kind": "messenger", "endpoint": workers, "options": options})


@WORKER_SPECS.register("cluster")
def _cluster(cluster, model_store: str, timeout_s: float, deployments: str | None = None) -> Workers:
    """A LocalCluster the caller started (and stops): its workers must serve `model_store`."""
    return Workers(_cluster_spec(cluster))


def _cluster_spec(cluster: LocalCluster) -> dict:
    """The dealers' spec of a LocalCluster: its front, and its run's keys (a path on this host,
    where the Spark tasks that reach a local cluster run)."""
    spec: dict = {"kind": "messenger", "endpoint": cluster.front}
    if getattr(cluster, "keys_dir", None):
        spec["options"] = {"keys_dir": cluster.keys_dir}
    return spec


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


def check_workers(workers) -> None:
    """WorkersSpecError when `workers` is not a usable spec, without starting or probing
    anything: for callers to run before costly work (preparing the graph), so a typo in
    --workers fails in a second rather than after the Spark preparation."""
    shape = _shape(workers)
    if shape is None:
        raise WorkersSpecError(f"unknown workers spec {workers!r}; accepted: {ACCEPTED}")
    SYNTAX.get(shape, lambda _: None)(workers)


def workers_for(
    workers, model_store: str, *, connect_timeout: float | None = None, deployments: str | None = None
) -> Workers:
    """infer(workers=...): "inprocess" (default), "local[N]" (starts a broker + N sparkgnn-worker
    processes, stopped when the job ends), "tcp://host:port" / "ipc://path" (a running broker whose
    workers load models from the same model store: checked at once, BrokerUnreachableError or
    NoWorkerError after `connect_timeout` seconds), or a started LocalCluster. Anything else is a
    WorkersSpecError listing the accepted forms. `deployments`: the deployments file local[N]
    workers serve from (sparkgnn.serving.served); workers that run elsewhere were given theirs
    when they were started."""
    check_workers(workers)
    shape = _shape(workers)
    assert shape is not None  # check_workers refused anything else
    return WORKER_SPECS.lookup(shape)(workers, model_store, connect_timeout_s(connect_timeout), deployments=deployments)
