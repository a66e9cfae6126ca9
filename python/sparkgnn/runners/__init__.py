"""Where DL steps run: in this process, on `local[N]` worker processes, or on the workers of a
running broker (tcp:// / ipc://). The engine (batch layers) and serving (CGP partitions) both pick
their runners here; neither reaches into the other for it.

    workers     `workers=` / `--workers` specs: check_workers (syntax, nothing started),
                workers_for (starts local[N], probes a broker), Workers, WorkersSpecError
    transports  get_transport(spec): how one Spark task (or the serving driver) reaches the DL
                handler: "inprocess" (the handler runs here) or "messenger" (a broker's dealer)

Depends on dl (the in-process handler) and messenger (dealers, LocalCluster), never on engine or
serving. The in-process handler serves every op registered with sparkgnn.dl.ops.OPS in this
process: dl's own layer_step, plus the ops of the layers above that send them (serving registers
serving_partials when it is imported; a standalone `sparkgnn-worker` registers it at start).
"""

from sparkgnn.runners.transports import DEFAULT_MESSENGER_OPTIONS, TRANSPORTS, get_transport
from sparkgnn.runners.workers import (
    ACCEPTED,
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT_S,
    WORKER_SPECS,
    Workers,
    WorkersSpecError,
    check_workers,
    connect_timeout_s,
    workers_for,
)

__all__ = [
    "ACCEPTED",
    "CONNECT_TIMEOUT_ENV",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_MESSENGER_OPTIONS",
    "TRANSPORTS",
    "WORKER_SPECS",
    "Workers",
    "WorkersSpecError",
    "check_workers",
    "connect_timeout_s",
    "get_transport",
    "workers_for",
]
