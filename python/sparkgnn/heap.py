"""Keep freed memory inside a long-lived process so the next step reuses it instead of faulting in
fresh pages.

Why: on these VMs the first touch of fresh memory costs far more than touching memory the process
already holds (figures in docs/ARCHITECTURE.md, "Data movement and the planner"). glibc hands every
block above its mmap threshold (128 KiB, rising to at most 32 MiB) back to the OS on free, and trims
the heap top above 128 KiB; pyarrow's default pool (mimalloc) purges freed pages too. A layer step
allocates several GiB of short-lived buffers (received rows, ordered payloads, messages, output
rows), so without this every step of a reused Spark Python worker, and every batch of a messenger
worker, would pay those page faults again.

What it does, once per process: raises glibc's mmap and trim thresholds to their maximum (2 GiB
- 1: blocks up to that size come from the heap and stay there after free) and points pyarrow's
default pool at the system allocator so Arrow buffers share that heap. Peak memory is unchanged
(the planner budgets each task's peak); what changes is that the peak stays resident in the
worker until it exits, where it is reused by the next step instead of being returned and refaulted.
Not glibc (musl, macOS): nothing to do, the call is a no-op.

The kept memory is bounded: a worker that serves several partitions per step (fewer concurrent
tasks than partitions, planner.partitions) or runs a long series of steps grows its heap by
fragmentation (big buffers of different sizes interleaved with long-lived caches), and on a large
graph two workers' kept heaps plus their memory-mapped inputs can outgrow the machine and thrash
the page cache (docs/ARCHITECTURE.md, "Concurrent tasks"). release_retained_memory trims once a
worker holds more than the plan's bound.
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


def _libc_function(name: str):
    """glibc's `name`, None where the C library has no such function (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def retain_freed_memory() -> bool:
    """Make this process keep and reuse freed memory (see module). Idempotent; returns whether the
    allocator accepted the settings (False where libc is not glibc)."""
    global _retaining
    if _retaining:
        return True
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    accepted = bool(mallopt(M_MMAP_THRESHOLD, LARGEST_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, LARGEST_THRESHOLD))
    if accepted:
        pa.set_memory_pool(pa.system_memory_pool())
    _retaining = accepted
    return accepted


def anonymous_resident_bytes() -> int | None:
    """This process's resident anonymous memory (its heap, not mapped files), None off Linux."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def release_retained_memory(limit_bytes: int | None) -> bool:
    """Hand freed heap memory back to the OS (glibc malloc_trim) when this process holds more than
    `limit_bytes` resident anonymous bytes (see the module); returns whether it trimmed. None: no
    bound."""
    if limit_bytes is None:
        return False
    held = anonymous_resident_bytes()
    if held is None or held <= limit_bytes:
        return False
    malloc_trim = _libc_function("malloc_trim")
    return bool(malloc_trim(0)) if malloc_trim is not None else False
