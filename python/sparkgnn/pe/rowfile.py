"""Row-addressable copies of store layers: an Arrow IPC file per committed layer attempt, sorted by
id, that a reader memory-maps and fetches given rows from without reading the layer whole.

WHY next to the Parquet files: Spark (and every whole-layer reader) reads the Parquet files, but
Parquet cannot fetch rows at random: a cold incremental refresh (pe/refresh.py) that needs a few
thousand rows of a layer of millions would read and decode all of it. The row file holds the
same rows in Arrow's IPC file format (the layout of memory), so mapping it costs nothing and
reading a row touches only the pages of that row:

    <attempt folder>/_rows.arrow    id int64 (sorted), alive uint8, h fixed_size_list<float32>[, state]

The leading '_' keeps it out of the attempt's Parquet file record (files.is_data_name), so Spark
and pyarrow's Parquet readers never see it. Rows are written in record batches of BATCH_ROWS; the
file's schema metadata holds a SPARSE INDEX (the first id of every batch), so a lookup picks the
batch by a search over a few hundred ids and the row by a search inside that batch -- or, when
the ids are dense (id = first id + row), the row directly. A delta attempt (versions.py) keeps
its tombstones as rows with alive = 0.

Keyed and checked like the rest of the store: the manifest records each row file (bytes, CRC-32,
rows) under manifest["row_files"][<layer key>] and, for the segments a delta lies on, in its
`bases` entries; PEStore.open reports a missing, resized or (verify="checksums") changed row
file as damage. The file's own metadata names the layer key, the version and the CRC-32s of the
Parquet files it was written beside, and a reader refuses (DamagedPEStore) a row file whose
metadata does not match the segment it is asked to read -- a row file is never silently used for
other rows. A segment without a row file (a store written before them, or a layer Spark wrote)
has no row reader, and its readers read the layer whole as before.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from sparkgnn import files, npsets
from sparkgnn.errors import DamagedPEStore
from sparkgnn.pe.lookup import UnknownIds

log = logging.getLogger(__name__)

ROW_FILE = "_rows.arrow"
ROW_FILES_KEY = "row_files"
FORMAT = 1
BATCH_ROWS = 8192
_META = b"sparkgnn.rows"
_INDEX = b"sparkgnn.rows.index"


def write(folder: str, ids, columns: dict, *, alive=None, key: str, version: str, parquet: list[dict]) -> dict:
    """Write the row file of the attempt `folder`: `ids` int64 [n] (any order), `columns` name ->
    float32 [n, w] (h and, when stored, state), `alive` bool [n] (False: a tombstone; default all
    alive); `key`, `version` and `parquet` (the attempt's Parquet file record) bind it to its
    segment. Returns its record for the manifest ({file, bytes, crc32, rows})."""
    import pyarrow as pa

    ids = np.ascontiguousarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    if len(ids) > 1 and (ids[1:] == ids[:-1]).any():
        raise ValueError(f"row file of {key}: duplicate ids")
    alive_col = np.ones(len(ids), np.uint8) if alive is None else np.asarray(alive, bool)[order].astype(np.uint8)
    arrays = {"id": pa.array(ids), "alive": pa.array(alive_col)}
    for name, values in columns.items():
        values = np.ascontiguousarray(np.asarray(values, np.float32)[order])
        arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    table = pa.table(arrays)
    dense = bool(len(ids)) and int(ids[-1]) - int(ids[0]) == len(ids) - 1
    meta = {
        "format": FORMAT,
        "key": key,
        "version": version,
        "rows": len(ids),
        "batch_rows": BATCH_ROWS,
        "dense": dense,
        "parquet": [r["crc32"] for r in parquet],
    }
    schema = table.schema.with_metadata({_META: json.dumps(meta).encode(), _INDEX: ids[::BATCH_ROWS].tobytes()})
    # its CRC-32 taken from the bytes as they are written (not read back)
    with files.ChecksummedOutput(files.join(folder, ROW_FILE)) as sink:
        with pa.ipc.new_file(sink, schema) as out:
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                out.write_batch(batch)
    return {"file": ROW_FILE, "bytes": sink.size, "crc32": sink.crc32, "rows": len(ids)}


def problems(folder: str, record: dict | None, verify: str = "checksums") -> list[str]:
    """Why the row file recorded as `record` in the attempt `folder` is not the one committed
    ([] when it is, or when none was recorded; a missing `folder` is named by its Parquet check)."""
    if not record or files.kind(folder) != "dir":
        return []
    path = files.join(folder, record["file"])
    if files.kind(path) != "file":
        return [f"row file {record['file']} missing"]
    fs, inner = files.filesystem(path)
    info = fs.get_file_info(inner)
    if int(info.size) != int(record["bytes"]):
        return [f"row file {record['file']} changed size ({info.size} bytes, committed {record['bytes']})"]
    if verify == "checksums" and files.crc32(path) != record["crc32"]:
        return [f"row file {record['file']} changed content (CRC-32 differs)"]
    return []


def _groups(keys: np.ndarray):
    """(key, positions of `keys` holding it) for each distinct key, ascending: one sort, not a
    scan of every key per distinct key."""
    if not len(keys):
        return
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1
    bounds = [0, *starts.tolist(), len(keys)]  # plain ints: the loop below runs per distinct key
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        yield int(sorted_keys[start]), order[start:end]


class RowFile:
    """One row file, mapped (local) or opened for random access (remote), verified against the
    segment it is read for. `rows_read` counts the rows fetched from it."""

    def __init__(self, folder: str, record: dict, *, key: str, version: str, parquet: list[dict] | None):
        import pyarrow as pa

        path = files.join(folder, record["file"])
        self.what = f"row file {path}"
        fs, inner = files.filesystem(path)
        try:
            source = pa.memory_map(inner) if files.is_local(path) else fs.open_input_file(inner)
            self._reader = pa.ipc.open_file(source)
        except (OSError, pa.ArrowInvalid) as exc:
            raise DamagedPEStore(f"{self.what}: unreadable ({exc})") from exc
        metadata = self._reader.schema.metadata or {}
        try:
            meta = json.loads(metadata[_META])
            index = np.frombuffer(metadata[_INDEX], np.int64)
        except (KeyError, ValueError) as exc:
            raise DamagedPEStore(f"{self.what}: no sparkgnn row metadata") from exc
        expected = {
            "format": FORMAT,
            "key": key,
            "version": version,
            "rows": int(record["rows"]),
            "parquet": None if parquet is None else [r["crc32"] for r in parquet],
        }
        differs = [f"{k} {meta.get(k)!r} != {v!r}" for k, v in expected.items() if v is not None and meta.get(k) != v]
        if differs:
            raise DamagedPEStore(f"{self.what} does not belong to the segment it is read for: " + "; ".join(differs))
        self.rows = int(meta["rows"])
        self._batch_rows = int(meta["batch_rows"])
        self._dense = bool(meta["dense"])
        self._index = index
        self._first = int(index[0]) if len(index) else 0
        self._batches: dict[int, dict] = {}
        self.columns = [n for n in self._reader.schema.names if n not in ("id", "alive")]
        self.widths = {n: self._reader.schema.field(n).type.list_size for n in self.columns}
        self.rows_read = 0

    def _batch(self, i: int) -> dict:
        """Batch `i` as numpy views (zero-copy over the mapped file)."""
        got = self._batches.get(i)
        if got is None:
            batch = self._reader.get_batch(i)
            got = {"id": batch.column("id").to_numpy(), "alive": batch.column("alive").to_numpy()}
            for name in self.columns:
                column = batch.column(name)
                got[name] = column.values.to_numpy().reshape(len(column), self.widths[name])
            self._batches[i] = got
        return got

    def find(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id in this file, -1 where it has none (tombstones count as rows)."""
        ids = np.asarray(ids, np.int64)
        out = np.full(len(ids), -1, np.int64)
        if not self.rows or not len(ids):
            return out
        if self._dense:
            guess = ids - self._first
            inside = (guess >= 0) & (guess < self.rows)
            out[inside] = guess[inside]
            return out
        batch = np.searchsorted(self._index, ids, side="right") - 1
        for b, sel in _groups(batch):
            if b < 0:
                continue
            batch_ids = self._batch(b)["id"]
            at = np.searchsorted(batch_ids, ids[sel])
            hit = at < len(batch_ids)
            hit[hit] = batch_ids[at[hit]] == ids[sel[hit]]
            out[sel[hit]] = b * self._batch_rows + at[hit]
        return out

    def take(self, rows: np.ndarray, names: Sequence[str]) -> dict:
        """{"id", "alive", *names}: the values of file rows `rows` (all >= 0)."""
        rows = np.asarray(rows, np.int64)
        self.rows_read += len(rows)
        out: dict[str, np.ndarray] = {"id": np.empty(len(rows), np.int64), "alive": np.empty(len(rows), np.uint8)}
        for name in names:
            out[name] = np.empty((len(rows), self.widths[name]), np.float32)
        for b, sel in _groups(rows // self._batch_rows):
            part = self._batch(b)
            local = rows[sel] - b * self._batch_rows
            for name in out:
                out[name][sel] = part[name][local]
        return out


class LayerRows:
    """The rows of one committed layer, fetched by id from its segments' row files (the newest
    segment holding an id wins; its tombstone means the layer has no such row)."""

    def __init__(self, segments: list[RowFile], what: str):
        self.segments = segments
        self.what = what
        self.columns = list(segments[-1].columns)

    @property
    def rows_read(self) -> int:
        """Rows fetched from the row files so far (tombstones and superseded rows included)."""
        return sum(s.rows_read for s in self.segments)

    def get(self, ids, column: str) -> np.ndarray:
        """float32 [n, w]: `column` of `ids`, in order. Ids the layer has no row for raise
        UnknownIds naming the count and examples."""
        if column not in self.columns:
            raise ValueError(f"{self.what}: no column {column!r} (has {', '.join(self.columns)})")
        ids = np.asarray(ids, np.int64).reshape(-1)
        out = np.empty((len(ids), self.segments[-1].widths[column]), np.float32)
        alive = np.zeros(len(ids), bool)
        todo = np.arange(len(ids))
        for segment in reversed(self.segments):
            if not len(todo):
                break
            rows = segment.find(ids[todo])
            hit = rows >= 0
            got = segment.take(rows[hit], [column])
            done = todo[hit]
            out[done] = got[column]
            alive[done] = got["alive"].astype(bool)
            todo = todo[~hit]
        if not alive.all():
            missing = npsets.unique(ids[~alive])
            raise UnknownIds(f"{self.what}: {len(missing)} unknown id(s), e.g. {missing[:5].tolist()}")
        return out


def layer_rows(segments, key: str, what: str) -> LayerRows | None:
    """A LayerRows over versions.Segment list `segments` (oldest first), or None when one of them
    has no row file (its layer is read whole)."""
    if not segments or any(not s.row_file for s in segments):
        return None
    opened = [RowFile(s.folder, s.row_file, key=key, version=s.version, parquet=s.recorded) for s in segments]
    return LayerRows(opened, what)
