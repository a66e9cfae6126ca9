"""How a Spark task reaches the DL engine.

A transport spec is plain data (it travels inside the Spark closure):
  {"kind": "inprocess", "model_store": DIR}      the handler runs inside this (Spark's Python
                                                 worker, or the serving driver's) process
  {"kind": "messenger", "endpoint": URL, ...}    a broker's front endpoint; standalone
                                                 `sparkgnn-worker`s run the layers (Spark tasks
                                                 then never import torch)
One transport per spec per process: handlers hold loaded models, dealers hold sockets. The
timeouts a spec from `workers_for` carries travel to each task's dealer, so no network wait in a
task is unbounded.
"""

from __future__ import annotations

import json

from sparkgnn.registry import Registry
from sparkgnn.runners.workers import WorkersSpecError

_CACHE: dict[str, object] = {}

# A layer step of a big partition can take minutes; a dead worker is detected by the broker's
# heartbeats (seconds), not by this timeout.
DEFAULT_MESSENGER_OPTIONS = {"timeout_s": 900.0, "retries": 3}

TRANSPORTS: Registry = Registry("transport kind", WorkersSpecError)


@TRANSPORTS.register("inprocess")
class InProcess:
    """Calls the DL handler directly, in this process. It serves the ops registered with
    sparkgnn.dl.ops.OPS here (looked up per call, so an op registered later is served too)."""

    def __init__(self, spec: dict):
        from sparkgnn.dl.handler import build_handler

        self.threads = int(spec.get("threads", 1))
        self.handler = build_handler(spec["model_store"], device=spec.get("device", "cpu"), threads=self.threads)

    def call(self, header: dict, tables: dict):
        import torch

        # torch's thread count is per process and a reused worker may serve plans that run
        # different numbers of tasks at once (each task gets cores / concurrent tasks threads)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        return self.handler(header, tables)


@TRANSPORTS.register("messenger")
class Messenger:
    """A dealer to the broker at spec["endpoint"]; the partition is the affinity key so the broker
    prefers the worker that served this partition before (per-partition caches stay warm)."""

    def __init__(self, spec: dict):
        from sparkgnn.messenger.transport import connect

        self.transport = connect(spec["endpoint"], **{**DEFAULT_MESSENGER_OPTIONS, **spec.get("options", {})})

    def call(self, header: dict, tables: dict):
        # the model (a layer step) or the deployment (a serving partition) and the partition
        owner = header.get("model") or header.get("deployment")
        header = dict(header, affinity=f"{owner}:{header.get('partition')}")
        return self.transport.call(header, tables)


def get_transport(spec: dict):
    key = json.dumps(spec, sort_keys=True)
    transport = _CACHE.get(key)
    if transport is None:
        transport = _CACHE[key] = TRANSPORTS.lookup(spec.get("kind", "inprocess"))(spec)
    return transport
