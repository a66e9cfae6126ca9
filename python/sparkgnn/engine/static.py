"""Per-partition static graph data, loaded inside Spark's Python tasks (numpy + pyarrow only).

Why: edges do not change between layers (Lotan: "edges stay partitioned, cached once"). The
prepare step writes them once per (graph, partition count) as Parquet partitioned by the owning
partition; each task reads its own slice and keeps the derived local indexes in a process-wide
cache, so layers 2..k pay nothing for structure. Any Spark-reachable filesystem path works (local in
local mode; a shared filesystem on a cluster).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

STAT_COLUMNS = ("gcn_degree",)


def _read_part(prep_dir: str, table: str, part: int, columns: list[str]) -> pa.Table:
    """One partition's slice of a layout; a partition with no rows has no directory (Spark writes none)."""
    path = os.path.join(prep_dir, table, f"part={part}")
    files = (
        sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet")) if os.path.isdir(path) else []
    )
    if not files:
        return pa.table({c: pa.array([], pa.float32() if c in ("w",) + STAT_COLUMNS else pa.int64()) for c in columns})
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def _np(table: pa.Table, column: str, dtype) -> np.ndarray:
    return np.ascontiguousarray(table.column(column).to_numpy(), dtype=dtype)


def positions(sorted_ids: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    """Local positions of `ids` in `sorted_ids`; raises naming the first ids that are not there."""
    pos = np.searchsorted(sorted_ids, ids)
    pos_clipped = np.minimum(pos, max(len(sorted_ids) - 1, 0))
    ok = (pos < len(sorted_ids)) & (sorted_ids[pos_clipped] == ids) if len(sorted_ids) else np.zeros(len(ids), bool)
    if not ok.all():
        bad = ids[~ok]
        raise ValueError(f"{len(bad)} {what} ids are not known to this partition; first: {bad[:5].tolist()}")
    return pos


@dataclass
class Owned:
    """The vertices a partition owns, sorted by id, with their node statistics."""

    ids: np.ndarray
    stats: dict


@dataclass
class InEdges:
    """Edges whose dst this partition owns. Sources: own vertices occupy local ids 0..n_own-1,
    foreign sources (mirrors) follow in `mirror_ids` order."""

    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    mirror_ids: np.ndarray


@dataclass
class OutEdges:
    """Edges whose src this partition owns. Destinations: own vertices first (0..n_own-1), then
    foreign destinations in `foreign_ids` order, each owned by partition `foreign_part`."""

    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    foreign_ids: np.ndarray
    foreign_part: np.ndarray


@dataclass
class Targets:
    """(own local index, partition) pairs: where own vertices' rows must be shipped."""

    local: np.ndarray
    part: np.ndarray


@functools.lru_cache(maxsize=256)
def owned(prep_dir: str, part: int) -> Owned:
    table = _read_part(prep_dir, "vertices", part, ["id", *STAT_COLUMNS])
    ids = _np(table, "id", np.int64)
    order = np.argsort(ids, kind="stable")
    return Owned(ids=ids[order], stats={c: _np(table, c, np.float32)[order] for c in STAT_COLUMNS})


@functools.lru_cache(maxsize=256)
def in_edges(prep_dir: str, part: int) -> InEdges:
    own = owned(prep_dir, part)
    table = _read_part(prep_dir, "in_edges", part, ["src", "dst", "w"])
    src, dst = _np(table, "src", np.int64), _np(table, "dst", np.int64)
    dst_local = positions(own.ids, dst, "edge dst")
    pos = np.searchsorted(own.ids, src)
    is_own = (
        (pos < len(own.ids)) & (own.ids[np.minimum(pos, max(len(own.ids) - 1, 0))] == src)
        if len(own.ids)
        else np.zeros(len(src), bool)
    )
    mirror_ids = np.unique(src[~is_own])
    src_local = np.where(is_own, pos, len(own.ids) + np.searchsorted(mirror_ids, src))
    return InEdges(
        src=src_local.astype(np.int64),
        dst=dst_local.astype(np.int64),
        w=_np(table, "w", np.float32),
        mirror_ids=mirror_ids,
    )


@functools.lru_cache(maxsize=256)
def out_edges(prep_dir: str, part: int) -> OutEdges:
    own = owned(prep_dir, part)
    table = _read_part(prep_dir, "out_edges", part, ["src", "dst", "w", "pd"])
    src, dst, pd = _np(table, "src", np.int64), _np(table, "dst", np.int64), _np(table, "pd", np.int64)
    src_local = positions(own.ids, src, "edge src")
    is_own = pd == part
    foreign_ids, first = np.unique(dst[~is_own], return_index=True)
    foreign_part = pd[~is_own][first].astype(np.int32)
    dst_local = np.empty(len(dst), dtype=np.int64)
    dst_local[is_own] = positions(own.ids, dst[is_own], "edge dst")
    dst_local[~is_own] = len(own.ids) + np.searchsorted(foreign_ids, dst[~is_own])
    return OutEdges(
        src=src_local, dst=dst_local, w=_np(table, "w", np.float32), foreign_ids=foreign_ids, foreign_part=foreign_part
    )


@functools.lru_cache(maxsize=256)
def targets(prep_dir: str, table_name: str, part: int) -> Targets:
    own = owned(prep_dir, part)
    table = _read_part(prep_dir, table_name, part, ["id", "pt"])
    local = positions(own.ids, _np(table, "id", np.int64), f"{table_name} vertex")
    return Targets(local=local, part=_np(table, "pt", np.int32))
