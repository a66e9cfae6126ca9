"""Numpy validation of in-memory graphs: each function finds one kind of defect and returns a
Problem (count + first offenders) or None; nothing here raises on its own.

Why separate from GraphData: the Parquet reader runs the same checks on Arrow columns before a
GraphData exists (ragged or null vectors cannot even be stacked into a matrix), and both must
report identically (wording lives in problems.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.graph.index import IdIndex
from sparkgnn.graph.problems import MAX_EXAMPLES, Problem, fmt_edge, fmt_edge_weight, fmt_ids

SPLIT_NAMES = ("train", "val", "test")
# In memory "" means "in no split"; on disk that is a null.
NO_SPLIT = ""


def first_rows(mask: np.ndarray, *keys: np.ndarray) -> np.ndarray:
    """Rows of the first offenders, ordered by `keys` (e.g. id, or (src, dst)) when given, so the
    examples are the smallest offenders, the same ones the Spark path shows."""
    rows = np.flatnonzero(mask)
    if keys and len(rows):
        rows = rows[np.lexsort([k[rows] for k in reversed(keys)])]
    return rows[:MAX_EXAMPLES]


def duplicate_ids(index: IdIndex) -> Problem | None:
    values, counts = index.duplicates()
    if len(values) == 0:
        return None
    examples = tuple(f"{v} (x{c})" for v, c in zip(values[:MAX_EXAMPLES], counts[:MAX_EXAMPLES], strict=True))
    return Problem("duplicate_id", len(values), examples)


def nonfinite_features(ids: np.ndarray, x: np.ndarray) -> Problem | None:
    bad = ~np.isfinite(x).all(axis=1) if x.size else np.zeros(len(ids), bool)
    count = int(bad.sum())
    return Problem("x_nonfinite", count, fmt_ids(ids[first_rows(bad, ids)])) if count else None


def dangling(kind: str, found: np.ndarray, src_ids: np.ndarray, dst_ids: np.ndarray) -> Problem | None:
    """kind is "dangling_src" or "dangling_dst"; examples are shown with original ids."""
    bad = ~found
    count = int(bad.sum())
    if not count:
        return None
    rows = first_rows(bad, src_ids, dst_ids)
    return Problem(kind, count, tuple(fmt_edge(s, d) for s, d in zip(src_ids[rows], dst_ids[rows], strict=True)))


def bad_weights(weight: np.ndarray | None, src_ids, dst_ids) -> Problem | None:
    if weight is None:
        return None
    bad = ~np.isfinite(weight) | (weight < 0)
    count = int(bad.sum())
    if not count:
        return None
    rows = first_rows(bad, src_ids, dst_ids)
    return Problem("bad_weight", count, tuple(fmt_edge_weight(src_ids[i], dst_ids[i], weight[i]) for i in rows))


def nonfinite_edge_attr(edge_attr: np.ndarray | None, src_ids, dst_ids) -> Problem | None:
    """Edges whose attribute vector holds a NaN or an infinity (edges shown by original ids)."""
    if edge_attr is None or not edge_attr.size:
        return None
    bad = ~np.isfinite(edge_attr).all(axis=1)
    count = int(bad.sum())
    if not count:
        return None
    rows = first_rows(bad, src_ids, dst_ids)
    return Problem("edge_attr_nonfinite", count, tuple(fmt_edge(src_ids[i], dst_ids[i]) for i in rows))


def bad_labels(ids: np.ndarray, y: np.ndarray | None) -> Problem | None:
    if y is None:
        return None
    bad = y < -1
    count = int(bad.sum())
    return (
        Problem("bad_label", count, tuple(f"id {ids[i]} (y={y[i]})" for i in first_rows(bad, ids))) if count else None
    )


def bad_splits(ids: np.ndarray, split: np.ndarray | None) -> Problem | None:
    if split is None:
        return None
    bad = ~np.isin(split, (*SPLIT_NAMES, NO_SPLIT))
    count = int(bad.sum())
    return (
        Problem("bad_split", count, tuple(f"id {ids[i]} ({str(split[i])!r})" for i in first_rows(bad, ids)))
        if count
        else None
    )


def bad_dense_index(num_nodes: int, edge_src: np.ndarray, edge_dst: np.ndarray) -> Problem | None:
    bad = (edge_src < 0) | (edge_src >= num_nodes) | (edge_dst < 0) | (edge_dst >= num_nodes)
    count = int(bad.sum())
    if not count:
        return None
    return Problem(
        "bad_index",
        count,
        tuple(fmt_edge(edge_src[i], edge_dst[i]) for i in first_rows(bad, edge_src, edge_dst)),
        detail=str(num_nodes),
    )


def vector_column(
    ids: np.ndarray,
    column,
    expected_width: int | None = None,
    kinds: tuple[str, str] = ("null_x", "x_width"),
    label: Callable[[int], str] | None = None,
):
    """Turn an Arrow list / large_list / fixed_size_list column of numbers into a C-contiguous
    float32 [N, F] matrix, or report null rows and rows of the wrong length.

    Returns (matrix or None, [problems]). Works chunk by chunk into one preallocated output,
    because a 20M x 128 column must not be copied twice. The expected width is graph.json's
    feature_dim when known, else the most common row length (so one bad row is named as the
    offender, not the 10,000 good ones). `kinds` names the null and width problems and `label(row)`
    shows an offending row (default: its vertex id): edge_attr has its own kinds and shows edges.
    """
    if label is None:
        label = lambda i: f"id {ids[i]}"  # noqa: E731
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    n = len(ids)
    nulls = (
        np.concatenate([c.is_null().to_numpy(zero_copy_only=False) for c in chunks]) if chunks else np.zeros(0, bool)
    )
    problems = []
    if nulls.any():
        rows = first_rows(nulls, ids)
        shown = fmt_ids(ids[rows]) if kinds[0] == "null_x" else tuple(label(i) for i in rows)
        problems.append(Problem(kinds[0], int(nulls.sum()), shown))
    lengths = (
        np.concatenate(
            [pc.fill_null(pc.list_value_length(c), -1).to_numpy(zero_copy_only=False) for c in chunks]
        ).astype(np.int64)
        if chunks
        else np.zeros(0, np.int64)
    )
    valid = lengths[~nulls]
    if expected_width is None:
        if len(valid) == 0:
            expected_width = 0
        else:
            widths, counts = np.unique(valid, return_counts=True)
            expected_width = int(widths[np.argmax(counts)])
    wrong = ~nulls & (lengths != expected_width)
    if wrong.any():
        rows = first_rows(wrong, ids)
        problems.append(
            Problem(
                kinds[1],
                int(wrong.sum()),
                tuple(f"{label(i)} (len {lengths[i]})" for i in rows),
                detail=str(expected_width),
            )
        )
    if problems:
        return None, problems
    out = np.empty((n, expected_width), dtype=np.float32)
    pos = 0
    for chunk in chunks:
        flat = pc.list_flatten(chunk).to_numpy(zero_copy_only=False)
        count = len(chunk)
        out[pos : pos + count] = flat.reshape(count, expected_width)
        pos += count
    return out, []
