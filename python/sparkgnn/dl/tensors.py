"""Arrow tables <-> torch tensors for the DL handler (buffer views, no per-row work)."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.arrowvec import ALIGNMENT, aligned_empty, to_fixed_list, to_numpy_matrix
from sparkgnn.dl.staging import lookup


def tensor(values: np.ndarray, device: str) -> torch.Tensor:
    """numpy -> torch on `device`. Arrow buffers are read-only; torch warns about that but the DL ops
    never write into their inputs, so the view is safe and saves a copy. Buffers that are not
    64-byte aligned (e.g. read from a messenger payload) are copied: CPU kernels pick code paths by
    alignment, and results must not depend on how the data arrived (in-process == messenger,
    bit for bit). On an accelerator, an array of the step's tables was already copied there with
    all the others in one transfer (dl/staging.py): that view is returned."""
    staged = lookup(values)
    if staged is not None:
        return staged
    if values.ctypes.data % ALIGNMENT:
        aligned = aligned_empty(values.shape, values.dtype)
        aligned[...] = values
        values = aligned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = torch.from_numpy(values)
    return out.to(device) if device != "cpu" else out


def matrix(table: pa.Table, column: str, device: str, width: int | None = None) -> torch.Tensor:
    return tensor(to_numpy_matrix(table.column(column), width), device)


def matrices(table: pa.Table, column: str, device: str, width: int | None = None) -> list[torch.Tensor]:
    """A vector column as one tensor per chunk (no concatenation): a step's mirror payloads arrive
    as one memory-mapped block per source partition (engine.routed_files), and joining them would
    copy every row into the task's memory. An empty column is one empty [0, width] block."""
    chunks = table.column(column).chunks
    blocks = [tensor(to_numpy_matrix(chunk, width), device) for chunk in chunks if len(chunk)]
    return blocks or [tensor(to_numpy_matrix(pa.chunked_array([], table.schema.field(column).type), width), device)]


def index(table: pa.Table, column: str, device: str) -> torch.Tensor:
    values = table.column(column).to_numpy()
    return tensor(np.ascontiguousarray(values, dtype=np.int64), device)


def vector(table: pa.Table, column: str, device: str) -> torch.Tensor:
    values = table.column(column).to_numpy()
    return tensor(np.ascontiguousarray(values, dtype=np.float32), device)


def fixed_list(values: torch.Tensor) -> pa.FixedSizeListArray:
    return to_fixed_list(values.detach().to("cpu").contiguous().numpy())
