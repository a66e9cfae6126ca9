"""Seeded train/val/test splits over labelled vertices.

Why one function with counts OR fractions: Cora is traditionally split Planetoid-style (20 per
class for training, 500 val, 1000 test) while IMDB and synthetic graphs use fractions; both must
be reproducible from a seed alone and must never put unlabelled vertices (y = -1) in a split.
Vertices in no split get "" (null on disk).
"""

from __future__ import annotations

import numpy as np

from sparkgnn.graph.checks import NO_SPLIT


def _count(amount: int | float, pool: int) -> int:
    return int(round(amount * pool)) if isinstance(amount, float) else int(amount)


def make_split(
    y: np.ndarray,
    *,
    seed: int = 0,
    train: int | float = 0.6,
    val: int | float = 0.2,
    test: int | float = 0.2,
    train_per_class: int | None = None,
) -> np.ndarray:
    """Assign "train"/"val"/"test"/"" to each vertex; only vertices with y >= 0 are eligible.

    Ints are counts, floats fractions of the eligible vertices. With train_per_class, the first
    `train_per_class` vertices of each class in a seeded permutation form the training set (and
    `train` is ignored); val and test are then drawn from the rest, in permutation order.
    """
    y = np.asarray(y)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(np.flatnonzero(y >= 0))
    pool = len(perm)
    if train_per_class is not None:
        classes = y[perm]
        order = np.argsort(classes, kind="stable")  # per class, in permutation order
        starts = np.searchsorted(classes[order], classes[order], side="left")
        rank_in_class = np.empty(pool, np.int64)
        rank_in_class[order] = np.arange(pool) - starts
        in_train = rank_in_class < train_per_class
        train_idx, rest = perm[in_train], perm[~in_train]
    else:
        n_train = _count(train, pool)
        train_idx, rest = perm[:n_train], perm[n_train:]
    n_val, n_test = _count(val, pool), _count(test, pool)
    if n_val + n_test > len(rest):
        raise ValueError(
            f"split asks for {len(train_idx)} train + {n_val} val + {n_test} test vertices but only {pool} are labelled"
        )
    split = np.full(len(y), NO_SPLIT, dtype="<U5")
    split[train_idx] = "train"
    split[rest[:n_val]] = "val"
    split[rest[n_val : n_val + n_test]] = "test"
    return split
