"""The ops serving adds to a DL handler: "serving_partials" runs one CGP partition of a serving
request's layer in a DL worker (cgp_wire.py carries it as JSON + Arrow, cgp_worker.py runs it);
"serve_batch" answers a batch of online requests and "serve_evict" drops a retired deployment
(serving.online.batch_op), both on the deployment cache of the worker whose handler serves them
(`WorkerOps`). Each serves only the deployments this process was started with or
its controller registered (serving.served), named in the header by id; a header naming a path
or an engine option is refused.

WHY here and not in sparkgnn.dl: the DL handler is the torch worker layer and knows nothing of
serving; serving plugs its ops into the handler's op registry (sparkgnn.dl.ops.OPS). `register`
is called by the composition roots: this package's __init__ (so the in-process runner serves the
op wherever serving sends it) and `sparkgnn-worker` (sparkgnn.worker.cli) at start, since nothing
else imports serving in a standalone worker; `sparkgnn-worker` also builds its handler on a
`WorkerOps(...).registry()`. Registering twice is harmless.
"""

from __future__ import annotations

from sparkgnn.dl.ops import OPS
from sparkgnn.registry import Registry
from sparkgnn.serving import cgp_wire
from sparkgnn.serving.online import batch_op


def serving_partials(models, header: dict, tables: dict) -> dict:
    """One partition of a serving request's layer (computation graph parallelism); `models`
    (the handler's ModelRegistry) is unused: the header's deployment id names the graph, model
    and store this worker serves under it."""
    return cgp_wire.handle(header, tables)


class WorkerOps:
    """Ops "serve_batch" and "serve_evict" of one worker, answered from the deployment cache that
    worker owns (batch_op.DeploymentCache): a worker's loaded deployments are its own state,
    held by its handler, never a module global two workers in a process would share."""

    def __init__(self, cache: batch_op.DeploymentCache | None = None):
        self.cache = cache if cache is not None else batch_op.DeploymentCache()

    def serve_batch(self, models, header: dict, tables: dict) -> dict:
        """A batch of online requests (batch_op.serve_batch); `models` is unused: the header's
        deployment id names the graph, model and store this worker serves under it, loaded once."""
        return batch_op.serve_batch(header, tables, self.cache)

    def serve_evict(self, models, header: dict, tables: dict) -> dict:
        """Drop retired deployments (ids its controller withdrew) from this worker's cache
        (batch_op.DeploymentCache.retire)."""
        return batch_op.serve_evict(header, tables, self.cache)

    def registry(self, base: Registry = OPS) -> Registry:
        """The ops a handler of this worker serves: those of `base` (as registered now) plus
        serve_batch and serve_evict on this worker's cache."""
        ops: Registry = Registry(base.what, base.error)
        ops.update(base)
        ops.register(batch_op.BATCH_OP, self.serve_batch)
        ops.register(batch_op.EVICT_OP, self.serve_evict)
        return ops


SERVING_OPS = {cgp_wire.OP: serving_partials}


def register(ops: Registry = OPS) -> None:
    """Add serving's stateless ops (serving_partials) to a DL handler's op registry (idempotent;
    another function already registered under one of their names is refused by the registry).
    serve_batch and serve_evict hold a worker's deployments: a worker adds them with
    `WorkerOps(...).registry()`."""
    for name, run in SERVING_OPS.items():
        if ops.get(name) is not run:
            ops.register(name, run)
