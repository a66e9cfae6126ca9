"""Per-partition static graph data, loaded inside Spark's Python tasks (numpy + pyarrow only).

Why: edges do not change between layers (Lotan: "edges stay partitioned, cached once"). The
prepare step writes them once per (graph, partition count) as Parquet partitioned by the owning
partition; each task reads its own slice and keeps the derived local indexes in a process-wide
cache, so layers 2..k pay nothing for structure. Any Spark-reachable filesystem path works (local in
local mode; a shared filesystem on a cluster).

The derived local indexes of the edge layouts (sources and destinations as local positions, the
mirror or foreign id lists) are also written next to the layout, once, by the first task that
builds them (`<prep>/local/<layout>/part=<p>.npz`, hidden temporary + rename). Why: Spark does not
promise a partition the same Python worker in the next step, and a miss would rebuild them from the
Parquet slice with two searchsorted passes and a unique over every edge, most of a collect, where
loading the saved arrays is cheap. A saved file is trusted only if it names the same
source files (names and sizes) as the layout and vertex slices it was derived from. Listing and
reading go through sparkgnn.files (pyarrow.fs), so a prep dir on s3:// works too; there a saved
file is one object put whole (no temporary, no rename).
"""

from __future__ import annotations

import functools
import io
import os
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkgnn import files as fsys
from sparkgnn import npsets
from sparkgnn.arrowvec import to_numpy_matrix
from sparkgnn.engine.degrees import PREPARED_STATS, aligned_sums, is_out_stat, stat_sql
from sparkgnn.planner.partitions import CACHED_PARTITIONS

#: The vertex layout's statistic columns (keys of sparkgnn.stat_keys), each owned vertex's.
STAT_COLUMNS = PREPARED_STATS
#: The in_edges column holding each edge's attribute vector (graphs with edge_attr only).
EDGE_ATTR_COLUMN = "a"


def _read_part(prep_dir: str, table: str, part: int, columns: list[str]) -> pa.Table:
    """One partition's slice of a layout; a partition with no rows has no directory (Spark writes none)."""
    files = _part_files(prep_dir, table, part)
    if not files:
        return pa.table({c: pa.array([], pa.float32() if c in ("w",) + STAT_COLUMNS else pa.int64()) for c in columns})
    fs = fsys.filesystem(files[0][0])[0]
    return pa.concat_tables([pq.read_table(fsys.filesystem(f)[1], columns=columns, filesystem=fs) for f, _ in files])


def _part_files(prep_dir: str, table: str, part: int) -> list[tuple[str, int]]:
    """(path, size) of the Parquet files of one partition's slice, sorted ([] without a folder)."""
    path = fsys.join(prep_dir, table, f"part={part}")
    fs, inner = fsys.filesystem(path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    except NotADirectoryError:
        return []
    return sorted(
        (fsys.join(path, i.base_name), int(i.size))
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
    )


def _source_key(prep_dir: str, tables: tuple[str, ...], part: int) -> str:
    """What a derived file was built from: the file names and sizes of the layout slices."""
    return "|".join(
        table + "=" + ";".join(f"{f.rpartition('/')[2]}:{size}" for f, size in _part_files(prep_dir, table, part))
        for table in tables
    )


def _derived(prep_dir: str, table: str, part: int, build) -> dict[str, np.ndarray]:
    """The arrays `build()` derives from a layout slice, from `<prep>/local/` when an earlier task
    saved them for the same source files, else built and saved (see the module)."""
    key = _source_key(prep_dir, (table, "vertices"), part)  # local positions follow the owned ids
    path = fsys.join(prep_dir, "local", table, f"part={part}.npz")
    if not fsys.is_local(path):
        return _derived_remote(path, key, build)
    path = fsys.filesystem(path)[1]
    if os.path.exists(path):
        try:
            with np.load(path, allow_pickle=False) as saved:
                if str(saved["source_key"]) == key:
                    return {name: saved[name] for name in saved.files if name != "source_key"}
        except (OSError, ValueError, KeyError):
            pass  # unreadable or partial (another writer): rebuild and replace it
    arrays = build()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = os.path.join(os.path.dirname(path), f".part={part}.{uuid.uuid4().hex}.npz")
    try:
        with open(temporary, "wb") as fh:
            np.savez(fh, source_key=np.array(key), **arrays)
        os.replace(temporary, path)
    except OSError:  # a read-only work dir costs the rebuild next time, nothing else
        if os.path.exists(temporary):
            os.remove(temporary)
    return arrays


def _derived_remote(path: str, key: str, build) -> dict[str, np.ndarray]:
    """_derived on a remote prep dir: the saved file is read and written whole (one object)."""
    try:
        with np.load(io.BytesIO(fsys.read_bytes(path)), allow_pickle=False) as saved:
            if str(saved["source_key"]) == key:
                return {name: saved[name] for name in saved.files if name != "source_key"}
    except (OSError, ValueError, KeyError):
        pass
    arrays = build()
    buffer = io.BytesIO()
    np.savez(buffer, source_key=np.array(key), **arrays)
    try:
        fsys.write_bytes_atomic(path, buffer.getvalue())
    except OSError:
        pass
    return arrays


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


class IdIndex:
    """Local positions among a partition's sorted, distinct ids through a hash table (pandas):
    a task looks up every routed row's id and every edge end, millions of random lookups, where a
    hash probe beats numpy's binary search by about an order of magnitude."""

    def __init__(self, sorted_ids: np.ndarray):
        import pandas as pd

        self.ids = sorted_ids
        self._index = pd.Index(sorted_ids)
        if not self._index.is_unique:
            raise ValueError(f"partition ids are not distinct ({len(sorted_ids) - self._index.nunique()} repeats)")

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Positions of `ids`, -1 where an id is not there."""
        return self._index.get_indexer(ids)

    def positions(self, ids: np.ndarray, what: str) -> np.ndarray:
        """Positions of `ids`; raises naming the first ids that are not there."""
        pos = self.lookup(ids)
        bad = pos < 0
        if bad.any():
            raise ValueError(
                f"{int(bad.sum())} {what} ids are not known to this partition; first: {ids[bad][:5].tolist()}"
            )
        return pos


@dataclass
class Owned:
    """The vertices a partition owns, sorted by id, with their node statistics (by stat key)."""

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
    # [E, D] float32 edge attributes in edge order (None: the layout has none)
    attr: np.ndarray | None = None


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
    """(own local index, partition) pairs: where own vertices' rows must be shipped, grouped by partition."""

    local: np.ndarray
    part: np.ndarray


@functools.lru_cache(maxsize=256)
def owned(prep_dir: str, part: int) -> Owned:
    table = _read_part(prep_dir, "vertices", part, ["id", *STAT_COLUMNS])
    ids = _np(table, "id", np.int64)
    order = np.argsort(ids, kind="stable")
    return Owned(ids=ids[order], stats={c: _np(table, c, np.float32)[order] for c in STAT_COLUMNS})


# Where engine.prepare.ensure_out_stats writes an out-edge statistic (out_stats/<key>/part=<p>).
OUT_STATS_DIR = "out_stats"


@functools.lru_cache(maxsize=256)
def out_stat(prep_dir: str, part: int, key: str) -> np.ndarray:
    """Out-edge statistic `key` (engine.degrees.is_out_stat) of the vertices partition `part` owns,
    in owned()'s order: the sums of its on-demand piece (every row of a vertex added up: the prepare
    tasks write partial sums), the statistic's empty value for a vertex with no row. The piece must
    have been written (engine.prepare.ensure_out_stats) before a step reads it."""
    ids = owned(prep_dir, part).ids
    table = _read_part(prep_dir, fsys.join(OUT_STATS_DIR, key), part, ["id", "v"])
    sums = table.column("v").to_numpy().astype(np.float64, copy=False)
    return aligned_sums(ids, _np(table, "id", np.int64), sums, stat_sql(key)[1])


def stat_columns(prep_dir: str, part: int, keys) -> dict[str, np.ndarray]:
    """{key: float32 values in owned()'s order} of the statistic keys a step reads: the in-edge ones
    from the vertex layout, the out-edge ones from their on-demand pieces (out_stat)."""
    stats = owned(prep_dir, part).stats
    return {key: out_stat(prep_dir, part, key) if is_out_stat(key) else stats[key] for key in keys}


# The edge arrays of a partition (|E_p| x 20 bytes and more) are kept for the last LAYOUT_ENTRIES
# partitions a worker served, like the CSR built from them (dl/csr.py MAX_ENTRIES): a worker that
# serves several partitions per step reloads the others' arrays from <prep>/local/ (a page-cache
# read) instead of holding every partition's edges at once. Vertex-sized tables stay cached.
LAYOUT_ENTRIES = CACHED_PARTITIONS


@functools.lru_cache(maxsize=LAYOUT_ENTRIES)
def in_edges(prep_dir: str, part: int) -> InEdges:
    def build() -> dict[str, np.ndarray]:
        own = IdIndex(owned(prep_dir, part).ids)
        with_attr = _has_column(prep_dir, "in_edges", part, EDGE_ATTR_COLUMN)
        table = _read_part(prep_dir, "in_edges", part, ["src", "dst", "w"] + ([EDGE_ATTR_COLUMN] if with_attr else []))
        src, dst = _np(table, "src", np.int64), _np(table, "dst", np.int64)
        dst_local = own.positions(dst, "edge dst")
        src_local = own.lookup(src)
        foreign = src_local < 0
        mirror_ids = npsets.unique(src[foreign])
        src_local[foreign] = len(own.ids) + IdIndex(mirror_ids).lookup(src[foreign])
        arrays = {
            "src": src_local.astype(np.int64),
            "dst": dst_local.astype(np.int64),
            "w": _np(table, "w", np.float32),
            "mirror_ids": mirror_ids.astype(np.int64),
        }
        if with_attr:
            arrays["attr"] = to_numpy_matrix(table.column(EDGE_ATTR_COLUMN))
        return arrays

    return InEdges(**_derived(prep_dir, "in_edges", part, build))


def _has_column(prep_dir: str, table: str, part: int, column: str) -> bool:
    """Whether a partition's slice of a layout has `column` (False for an empty slice)."""
    files = _part_files(prep_dir, table, part)
    if not files:
        return False
    fs, inner = fsys.filesystem(files[0][0])
    return column in pq.read_schema(inner, filesystem=fs).names


@functools.lru_cache(maxsize=LAYOUT_ENTRIES)
def out_edges(prep_dir: str, part: int) -> OutEdges:
    def build() -> dict[str, np.ndarray]:
        own = IdIndex(owned(prep_dir, part).ids)
        table = _read_part(prep_dir, "out_edges", part, ["src", "dst", "w", "pd"])
        src, dst, pd = _np(table, "src", np.int64), _np(table, "dst", np.int64), _np(table, "pd", np.int64)
        src_local = own.positions(src, "edge src")
        is_own = pd == part
        foreign_ids, first = np.unique(dst[~is_own], return_index=True)
        foreign_part = pd[~is_own][first].astype(np.int32)
        dst_local = np.empty(len(dst), dtype=np.int64)
        dst_local[is_own] = own.positions(dst[is_own], "edge dst")
        dst_local[~is_own] = len(own.ids) + IdIndex(foreign_ids).lookup(dst[~is_own])
        return {
            "src": src_local.astype(np.int64),
            "dst": dst_local,
            "w": _np(table, "w", np.float32),
            "foreign_ids": foreign_ids.astype(np.int64),
            "foreign_part": foreign_part,
        }

    return OutEdges(**_derived(prep_dir, "out_edges", part, build))


@functools.lru_cache(maxsize=256)
def targets(prep_dir: str, table_name: str, part: int) -> Targets:
    own = owned(prep_dir, part)
    table = _read_part(prep_dir, table_name, part, ["id", "pt"])
    local = positions(own.ids, _np(table, "id", np.int64), f"{table_name} vertex")
    part_of = _np(table, "pt", np.int32)
    # Grouped by destination partition: routed output slices then name one destination each, and
    # the files exchange writes them as they are instead of re-sorting every batch (a copy of all
    # the payloads a step ships: 6.3 GB per layer at 32M edges).
    order = np.argsort(part_of, kind="stable")
    return Targets(local=local[order], part=part_of[order])
