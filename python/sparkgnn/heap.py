"""Keep freed memory inside a long-lived process so the next step reuses it instead of faulting in
fresh pages.

Why: on these VMs the first touch of fresh memory costs 1-2.3 s per GiB, while touching memory the
process already holds costs about 0.05 s per GiB (docs/PLATFORM.md; re-measured with 1 GiB numpy
fills a few seconds apart). glibc hands every block above its mmap threshold (128 KiB, rising to at
most 32 MiB) back to the OS on free, and trims the heap top above 128 KiB; pyarrow's default pool
(mimalloc) purges freed pages too. A layer step allocates several GiB of short-lived buffers
(received rows, ordered payloads, messages, output rows), so without this every step of a reused
Spark Python worker, and every batch of a messenger worker, paid those page faults again: the
dominant part of "collect" and "scatter" at 8M edges.

What it does, once per process: raises glibc's mmap and trim thresholds to their maximum (2 GiB
- 1: blocks up to that size come from the heap and stay there after free) and points pyarrow's
default pool at the system allocator so Arrow buffers share that heap. Peak memory is unchanged
(the planner budgets each task's peak); what changes is that the peak stays resident in the
worker until it exits, where it is reused by the next step instead of being returned and refaulted.
Not glibc (musl, macOS): nothing to do, the call is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import pyarrow as pa

# mallopt parameters (malloc.h) and the largest value mallopt accepts (an int).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
LARGEST_THRESHOLD = 2**31 - 1

_retaining = False


def retain_freed_memory() -> bool:
    """Make this process keep and reuse freed memory (see module). Idempotent; returns whether the
    allocator accepted the settings (False where libc is not glibc)."""
    global _retaining
    if _retaining:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    accepted = bool(mallopt(M_MMAP_THRESHOLD, LARGEST_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, LARGEST_THRESHOLD))
    if accepted:
        pa.set_memory_pool(pa.system_memory_pool())
    _retaining = accepted
    return accepted
