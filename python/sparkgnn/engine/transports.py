"""How a Spark task reaches the DL engine, and how infer(workers=...) sets that up.

A transport spec is plain data (it travels inside the Spark closure):
  {"kind": "inprocess", "model_store": DIR}      the handler runs inside Spark's Python worker
  {"kind": "messenger", "endpoint": URL, ...}    a broker's front endpoint; standalone
                                                 `sparkgnn-worker`s run the layers (Spark tasks
                                                 then never import torch)
One transport per spec per process: handlers hold loaded models, dealers hold sockets.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

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
            raise ValueError(f"unknown transport kind {kind!r}; known: {sorted(TRANSPORTS)}")
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


def _inprocess(workers, model_store: str) -> Workers:
    return Workers({"kind": "inprocess", "model_store": model_store})


def _local(workers: str, model_store: str) -> Workers:
    from sparkgnn.messenger.local import LocalCluster

    count = int(re.fullmatch(r"local\[(\d+)\]", workers).group(1))
    if count < 1:
        raise ValueError(f"workers={workers!r}: need at least one worker")
    cluster = LocalCluster(count, model_store=model_store, threads=1).start()
    return Workers({"kind": "messenger", "endpoint": cluster.front}, cluster)


def _endpoint(workers: str, model_store: str) -> Workers:
    return Workers({"kind": "messenger", "endpoint": workers})


def _cluster(cluster, model_store: str) -> Workers:
    """A LocalCluster the caller started (and stops): its workers must serve `model_store`."""
    return Workers({"kind": "messenger", "endpoint": cluster.front})


WORKER_SPECS = [
    (lambda w: w in (None, "inprocess"), _inprocess),
    (lambda w: isinstance(w, str) and re.fullmatch(r"local\[\d+\]", w) is not None, _local),
    (lambda w: isinstance(w, str) and re.match(r"(tcp|ipc|inproc)://", w) is not None, _endpoint),
    (lambda w: hasattr(w, "front") and hasattr(w, "stop"), _cluster),
]


def workers_for(workers, model_store: str) -> Workers:
    """infer(workers=...): "inprocess" (default), "local[N]" (starts a broker + N sparkgnn-worker
    processes, stopped when the job ends), "tcp://host:port" / "ipc://path" (a running broker whose
    workers load models from the same model store), or a started LocalCluster."""
    for matches, build in WORKER_SPECS:
        if matches(workers):
            return build(workers, model_store)
    raise ValueError(f"unknown workers spec {workers!r}; use 'inprocess', 'local[N]', 'tcp://host:port' or 'ipc://path'")
