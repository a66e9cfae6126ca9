"""glibc malloc tuning for large ZeroMQ messages.

WHY: ZeroMQ allocates every received 34 MB message with malloc. Above glibc's mmap threshold
(at most 32 MiB, so a 64K x 128 float32 batch is always above it) each one is a fresh mmap that
is page-faulted in and unmapped again on free, which caps ipc:// throughput on these VMs. With
mmap disabled for malloc (M_MMAP_MAX=0) and trimming raised, freed message buffers stay in the heap
and the next message reuses warm pages (the gain is measured in messenger/README.md). The cost is that a
process keeps its peak heap instead of returning it to the OS; set SPARKGNN_MALLOC_TUNE=0 to opt
out. Called at start-up of brokers, workers and dealers; idempotent; a no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
_TRIM_BYTES = 1 << 30
_done = None


def tune_malloc() -> bool:
    """Apply the tuning once per process; True when it took effect."""
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("SPARKGNN_MALLOC_TUNE", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    _done = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _TRIM_BYTES))
    return _done
