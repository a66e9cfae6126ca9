"""Keeping full garbage collections cheap in long-running processes (the serving workers, the
follower of `sparkgnn-refresh follow`).

WHY: a process that imported torch, PyG and pyarrow holds some 350,000 objects the cyclic
garbage collector tracks, and a full collection walks them all: about a quarter of a second on
one core, during which the process does nothing else (the GIL). A serving worker runs one after
each eviction (batch_op._free_memory), and Python runs its own every so often; both land in the
middle of a stream of requests or update batches, so freshness and tail latency pay for them.
`freeze_startup_objects` moves the objects alive when it is called (the imported modules, the
model) into the permanent generation (gc.freeze), once per process: later collections walk only
what was created since (the deployments, the batches), milliseconds instead.

Frozen objects are still freed by reference counting when their last reference goes; only
reference cycles among objects alive at the freeze are never collected, so the freeze is done
before a process loads what it will later drop (a worker's first deployment).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

_frozen = False


def freeze_startup_objects() -> bool:
    """Freeze the objects alive now out of the cyclic collector's walks (module doc), after one
    collection so no garbage is frozen; once per process (True when this call froze)."""
    global _frozen
    if _frozen:
        return False
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    _frozen = True
    log.debug(f"froze {gc.get_freeze_count()} startup objects in {time.perf_counter() - started:.3f}s")
    return True
