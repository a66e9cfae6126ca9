"""Small vectorised edge-list helpers shared by the dataset loaders."""

from __future__ import annotations

import numpy as np


def symmetrise(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of every edge, duplicates removed (sorted by (src, dst))."""
    both = np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])], axis=1)
    both = np.unique(both, axis=0)
    return both[:, 0].copy(), both[:, 1].copy()


def with_reverse(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges followed by their reverses (no dedup: for bipartite relations where a reverse
    can never coincide with an existing edge)."""
    return np.concatenate([src, dst]), np.concatenate([dst, src])
