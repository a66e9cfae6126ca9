"""The Handler a DL worker runs per task: header + Arrow tables in, header + Arrow tables out.

Same callable in-process (inside a Spark Python worker) and behind the messenger (a standalone
`sparkgnn-worker`). Ops are looked up in a registry (sparkgnn.dl.ops.OPS: dl's own layer_step,
plus what the composition roots register); models by fingerprint in a model store.
"""

from __future__ import annotations

import time

import torch

from sparkgnn.dl.model_store import ModelRegistry
from sparkgnn.dl.ops import OPS
from sparkgnn.dl.step import StepError, run_step
from sparkgnn.errors import SparkGNNError
from sparkgnn.registry import Registry


@OPS.register("layer_step")
def _op_layer_step(registry: ModelRegistry, header: dict, tables: dict) -> dict:
    fingerprint = header.get("model")
    if not fingerprint:
        raise StepError("task header carries no model fingerprint")
    return run_step(registry.get(fingerprint), header, tables, registry.device)


class Handler:
    """Callable(header, tables) -> (result header, result tables). Ops are looked up per call, so
    one registered after the handler was built is served too."""

    def __init__(self, registry: ModelRegistry, ops: Registry = OPS):
        self.registry = registry
        self.ops = ops

    def __call__(self, header: dict, tables: dict):
        op = header.get("op")
        run = self.ops.lookup(op)  # type: ignore[arg-type]  # a missing op is refused like an unknown one
        started = time.perf_counter()
        result = run(self.registry, header, tables)
        return {"op": op, "compute_s": time.perf_counter() - started}, result


def build_handler(model_store: str, device: str = "cpu", threads: int | None = None, *, ops: Registry = OPS) -> Handler:
    """The handler a worker serves. `threads` caps torch's intra-op threads (Spark already runs one
    task per core, so in-process handlers use 1); `ops`: the op registry it looks ops up in (a
    worker with state of its own, serving's deployment cache, passes one holding its ops)."""
    if threads:
        torch.set_num_threads(int(threads))
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SparkGNNError(f"device {device!r} requested but CUDA is not available on this worker")
    return Handler(ModelRegistry(model_store, device), ops)
