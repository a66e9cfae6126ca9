"""A step's tables on an accelerator: one host-to-device copy in, one device-to-host copy out.

Why: a layer step reads a dozen numeric columns (own h, one mirror block per source partition,
edge src/dst/weight, node statistics) and writes two or three (h, the next layer's payload, the
state). Copied one by one from pageable memory, each column pays its own transfer set-up and the
driver's bounce through a pinned staging area; packed into one page-locked buffer (reused and
grown across batches, never freed: pinning is the expensive part), they go over in one
`non_blocking` copy, and the results come back the same way, into page-locked memory too. On the
CPU nothing is staged: the step's tensors are views of the Arrow buffers (dl/tensors.py).

A large step on a GPU is bound by these host copies, not by its kernels (docs/ARCHITECTURE.md,
"the DL step on a GPU"): results copied into pageable memory go through the driver's own small
pinned bounce buffer and fault in every page of their fresh destination, and one thread packing
the inputs moves a few GB/s. So the results land in a page-locked block of torch's caching host
allocator (given back to it when the step's result tables are dropped, and reused by the next
step), and the inputs are packed by torch's copy, which runs on every intra-op thread.

How the step finds its staged columns without every call site knowing: `staged(tables, device)`
makes a lookup from each input array's (address, bytes, dtype, shape) to its device view, and
dl.tensors.tensor() consults it before copying anything, so the step code reads tables exactly
as it does on the CPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.arrowvec import ALIGNMENT, to_numpy_matrix

_ACTIVE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("sparkgnn_staged", default=None)
# device -> a page-locked host buffer (uint8), grown to the largest batch seen and reused
_HOST: dict[str, torch.Tensor] = {}


def _key(values: np.ndarray) -> tuple:
    return (values.ctypes.data, values.nbytes, values.dtype.str, values.shape)


def _column_arrays(column: pa.ChunkedArray) -> list[np.ndarray]:
    """The numpy views the step will ask dl.tensors for: a vector column's chunks as [rows, width]
    matrices, a numeric column's chunks as 1-d arrays; other types are not staged."""
    arrays = []
    for chunk in column.chunks:
        if not len(chunk):
            continue
        if pa.types.is_fixed_size_list(chunk.type):
            arrays.append(to_numpy_matrix(chunk))
        elif pa.types.is_integer(chunk.type) or pa.types.is_floating(chunk.type):
            if chunk.null_count == 0:
                arrays.append(chunk.to_numpy(zero_copy_only=True))
    return arrays


def input_arrays(tables: dict[str, pa.Table]) -> list[np.ndarray]:
    """Every distinct array a step may read from `tables` (a column that is one buffer once)."""
    seen, arrays = set(), []
    for table in tables.values():
        for column in table.columns:
            for values in _column_arrays(column):
                if values.flags.c_contiguous and _key(values) not in seen:
                    seen.add(_key(values))
                    arrays.append(values)
    return arrays


def _offsets(sizes: list[int]) -> tuple[list[int], int]:
    """ALIGNMENT-byte aligned start of each block, and the total size."""
    offsets, end = [], 0
    for size in sizes:
        start = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(start)
        end = start + size
    return offsets, end


def host_buffer(nbytes: int, device: str, pin: bool) -> torch.Tensor:
    """A uint8 host buffer of at least `nbytes` for transfers to `device`, page-locked when `pin`,
    reused across batches (grown, never shrunk)."""
    held = _HOST.get(device)
    if held is None or held.numel() < nbytes:
        # a normal tensor even when first asked for inside a step's inference_mode: one made there
        # could not be written outside it (stage copies into it in and out of inference mode)
        with torch.inference_mode(False):
            held = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pin)
        _HOST[device] = held
    return held


def _typed(block: torch.Tensor, dtype: np.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return block.view(torch.from_numpy(np.empty(0, dtype=dtype)).dtype).view(shape)


def stage(tables: dict[str, pa.Table], device: str, pin: bool | None = None) -> dict[tuple, torch.Tensor]:
    """Copy every input array of `tables` to `device` in one transfer; returns the lookup from an
    array's key to its device view (see the module). `pin` defaults to whether `device` is CUDA."""
    pin = str(device).startswith("cuda") if pin is None else pin
    arrays = input_arrays(tables)
    offsets, total = _offsets([values.nbytes for values in arrays])
    host = host_buffer(total, str(device), pin)
    with warnings.catch_warnings():  # Arrow buffers are read-only; they are only read here
        warnings.simplefilter("ignore", UserWarning)
        for values, start in zip(arrays, offsets, strict=True):
            host[start : start + values.nbytes].copy_(torch.from_numpy(values.reshape(-1).view(np.uint8)))
    on_device = host[:total].to(device, non_blocking=pin) if str(device) != "cpu" else host[:total]
    return {
        _key(values): _typed(on_device[start : start + values.nbytes], values.dtype, values.shape)
        for values, start in zip(arrays, offsets, strict=True)
    }


@contextlib.contextmanager
def staged(tables: dict[str, pa.Table], device: str, force: bool = False) -> Iterator[None]:
    """Within the block, dl.tensors.tensor() returns the staged device view of any input array of
    `tables`. Only for accelerators unless `force` (tests run the packing on the CPU)."""
    if str(device) == "cpu" and not force:
        yield
        return
    token = _ACTIVE.set(stage(tables, device))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def lookup(values: np.ndarray) -> torch.Tensor | None:
    """The staged device view of `values`, None outside `staged` or for an array not staged."""
    active = _ACTIVE.get()
    return None if active is None else active.get(_key(values))


def to_host(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Device tensors back on the host with one transfer (packed into one device buffer first) into
    page-locked memory (module doc; the views returned keep it alive); tensors already on the CPU
    are returned as they are."""
    if not tensors or all(t.device.type == "cpu" for t in tensors):
        return [t.detach().to("cpu") for t in tensors]
    flat = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    offsets, total = _offsets([block.numel() for block in flat])
    packed = torch.empty(total, dtype=torch.uint8, device=tensors[0].device)
    for block, start in zip(flat, offsets, strict=True):
        packed[start : start + block.numel()] = block
    host = torch.empty(total, dtype=torch.uint8, pin_memory=packed.device.type == "cuda")
    host.copy_(packed)  # blocking: the step's results are read as soon as this returns
    return [
        host[start : start + block.numel()].view(t.dtype).view(t.shape)
        for t, block, start in zip(tensors, flat, offsets, strict=True)
    ]
