"""Comparison helpers shared by the executor tests."""

import warnings
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.graph import GraphData


def pyg_reference(module, data: GraphData) -> np.ndarray:
    x = torch.from_numpy(data.x)
    edge_index = data.edge_index_torch()
    weight = torch.from_numpy(data.weight) if data.weight is not None else None
    with torch.no_grad():
        if weight is not None and getattr(module, "supports_edge_weight", False):
            return module(x, edge_index, edge_weight=weight).numpy()
        return module(x, edge_index).numpy()


def spark_output(result, data: GraphData) -> np.ndarray:
    """The (id, h) rows of `result` (a DataFrame, or its rows already read as an Arrow table) as an
    array in `data`'s vertex order; NaN rows for vertices without an output row."""
    table = result if isinstance(result, pa.Table) else result.toArrow()
    ids = table.column("id").to_numpy()
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    out = np.full((data.num_nodes, h.shape[1]), np.nan, dtype=np.float32)
    out[data.index_of(ids)] = h
    return out


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-30))


# The prefix of the warning for an exactness check that missed once and passed when the job and
# its reference were both run again: the intermittent float32 deviation of two-thread jobs that
# docs/ARCHITECTURE.md records under "An open exactness defect". Shown in the run's warnings
# summary, never silent. WHY a plain UserWarning, not a class of this module: pytest-xdist's
# controller re-creates a worker's warning by importing its category's module, which it cannot
# for a helper module on the workers' path only: a real deviation took a CI run down that way.
TRANSIENT_DEVIATION = "transient exactness deviation"


T = TypeVar("T")


def exact_or_transient(attempt: Callable[[int], T], what: str) -> T:
    """Run `attempt(0)`, an exactness check that raises AssertionError on a miss; on a miss run
    `attempt(1)` (the job in a fresh work dir and the reference recomputed) and let its miss fail
    the test. A deviation that repeats is a defect and fails; one that does not is the known
    intermittent one (a TRANSIENT_DEVIATION warning), reported with the first run's numbers. Returns what the
    attempt that passed returned."""
    try:
        return attempt(0)
    except AssertionError as first:
        result = attempt(1)
        message = f"{TRANSIENT_DEVIATION}: {what}: the first run missed and the rerun agreed: {first}"
        warnings.warn(message, UserWarning, stacklevel=2)
        return result
