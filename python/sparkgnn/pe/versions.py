"""Row-level store versions: a refreshed layer commits only the rows that changed, on top of the
same layer of the version it was refreshed from.

WHY: after a graph update, an incremental refresh (pe/refresh.py) recomputes the vertices the
update reaches -- a few percent of the graph for a small update -- and rewriting every other row
of every layer would make the write, not the computation, the cost of a refresh (writing a whole
layer costs more than recomputing a small change). So a layer may be committed as a DELTA: its own attempt holds only

    the rows of vertices recomputed or inserted (id, h, state), and
    a tombstone for each deleted vertex (its id with a null h and state),

and the manifest lists, oldest first, the SEGMENTS it lies on:

    manifest["bases"]["layer=<l>"] = [{"version": <graph fp>, "path": "layer=<l>/attempt=<id>",
                                       "files": [{file, bytes, crc32}, ...]}, ...]

each a committed layer attempt of an earlier version of the same model under the same store root
(<root>/<version>/<model fp>/<path>), with the file record it was committed with. The layer's rows
are the segments' rows with, for each id, the row of the NEWEST segment holding it, tombstones
dropped. Readers (PEStore lookups, Spark frames, the CGP workers) all read through `read` /
`spark_frame` here; integrity checks every segment's files against its record, so deleting or
rewriting an older version that a newer one lies on is reported by name (DamagedPEStore), never
read as a silent mix.

A chain is bounded: a refresh writes the layer whole again ("compacts") when the chain would pass
MAX_SEGMENTS, or when the changed rows are at least COMPACT_FRACTION of the layer (a delta that
large saves little write and costs every later read a merge).

A chain may also be shortened without writing a version whole (what `sparkgnn-refresh follow`
does, off its commit path): `write_compacted` writes the merged rows of a committed version V's
layer once more, as a COMPACTED segment in V's folder (`_compacted/<key>/<id>`, with its own file
record and row file, marked "compacted"), and a later delta whose chain holds V's segment lies on
`rebased` bases: the compacted segment, then only the segments after V's. Its rows are the same
(the compacted segment holds exactly V's merged rows) and `delta_over` still recognises it as a
delta over the version before it. WHY: writing a layer whole costs a commit many times a small
delta's; done beside the follower, the versions it publishes stay small deltas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkgnn import files
from sparkgnn.parquet_read import read_parquet
from sparkgnn.pe import integrity, layout, rowfile
from sparkgnn.pe.rowfile import ROW_FILES_KEY

BASES_KEY = "bases"
MAX_SEGMENTS = 8
COMPACT_FRACTION = 0.5
COMPACTED_DIR = "_compacted"  # a version folder's compacted segments (write_compacted)
SMALL_SEGMENT_BYTES = 4 << 20  # a segment this small is read file by file, on the calling thread


@dataclass(frozen=True)
class Segment:
    """One committed layer attempt a layer's rows are read from."""

    version: str  # graph fingerprint of the version that committed it
    folder: str  # its attempt folder
    recorded: list | None  # its file record (None: a store written before records)
    row_file: dict | None = None  # its row file's record (rowfile.py; None: read it whole)

    def paths(self) -> list[str] | None:
        if not self.recorded:
            return None
        return [files.join(self.folder, r["file"]) for r in self.recorded]


def version_dir(base: str, graph_fp: str) -> str:
    """The store directory of the same model for another graph version under the same root:
    <root>/<graph_fp>/<model fp>."""
    from sparkgnn.graph.fingerprint import check_fingerprint

    check_fingerprint(graph_fp, "PE store version: graph fingerprint")
    parent, _sep, model_fp = base.rstrip("/").rpartition("/")
    root = parent.rpartition("/")[0]
    return files.join(root, graph_fp, model_fp)


def bases(manifest: dict, key: str) -> list[dict]:
    """The base segments recorded for `key`, oldest first ([] for a layer committed whole)."""
    return list((manifest.get(BASES_KEY) or {}).get(key) or [])


def segments(base: str, manifest: dict, key: str) -> list[Segment]:
    """Every segment of `key`, oldest first, the layer's own committed attempt last."""
    out = [
        Segment(b["version"], files.join(version_dir(base, b["version"]), b["path"]), b.get("files"), b.get("row_file"))
        for b in bases(manifest, key)
    ]
    own = Segment(
        str(manifest.get("graph_fingerprint")),
        layout.committed_dir(base, manifest, key),
        (manifest.get(integrity.FILES_KEY) or {}).get(key),
        (manifest.get(ROW_FILES_KEY) or {}).get(key),
    )
    return [*out, own]


def chain_over(manifest: dict, key: str) -> list[dict]:
    """The `bases` entry of a delta committed over this manifest's layer `key`: its own bases
    plus its own committed attempt."""
    own = {
        "version": manifest["graph_fingerprint"],
        "path": (manifest.get(layout.PATHS_KEY) or {}).get(key) or key,
        "files": (manifest.get(integrity.FILES_KEY) or {}).get(key),
    }
    row_file = (manifest.get(ROW_FILES_KEY) or {}).get(key)
    if row_file:
        own["row_file"] = row_file
    return [*bases(manifest, key), own]


def _read_segment(segment: Segment, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    listed = segment.paths()
    if listed is None:
        fs, inner = files.filesystem(segment.folder)
        return pq.read_table(inner, filesystem=fs, columns=columns, partitioning=None)
    fs = files.filesystem(listed[0])[0]
    paths = [files.filesystem(p)[1] for p in listed]
    if listed and sum(int(r.get("bytes") or 0) for r in segment.recorded or ()) <= SMALL_SEGMENT_BYTES:
        # a small delta's own rows (what a delta swap reads per version): each file read directly,
        # without the dataset layer and its thread pool, a few times cheaper at this size
        tables = []
        for path in paths:
            with fs.open_input_file(path) as fh:
                tables.append(pq.ParquetFile(fh).read(columns=columns, use_threads=False))
        if all(t.schema.equals(tables[0].schema) for t in tables):
            return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return pq.read_table(paths, filesystem=fs, columns=columns, partitioning=None)


def merge_tables(tables: list):
    """Rows of `tables` (oldest first; columns id, h[, state]) with, per id, the row of the
    newest table holding it; rows whose h is null (tombstones) dropped."""
    import pyarrow as pa

    schema = tables[0].schema
    try:
        tables = [t.cast(schema) for t in tables]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # fixed_size_list next to Spark's list<float>
        vec = pa.list_(pa.float32())
        schema = pa.schema([pa.field(f.name, vec if pa.types.is_list_like(f.type) else f.type) for f in schema])
        tables = [t.cast(schema) for t in tables]
    table = pa.concat_tables(tables)
    ids = table.column("id").to_numpy()
    _uniq, first_from_end = np.unique(ids[::-1], return_index=True)
    newest = len(ids) - 1 - first_from_end
    alive = table.column("h").is_valid().to_numpy(zero_copy_only=False)
    keep = np.sort(newest[alive[newest]])
    return table.take(pa.array(keep))


def read(base: str, manifest: dict, key: str, columns=None):
    """The rows of layer `key` as a pyarrow.Table (every segment merged)."""
    chain = segments(base, manifest, key)
    if len(chain) == 1:
        return layout.read_table(base, manifest, key, columns)
    wanted = None if columns is None else list(dict.fromkeys(["id", "h", *columns]))
    merged = merge_tables([_read_segment(s, wanted) for s in chain])
    return merged if columns is None else merged.select(list(columns))


def read_layer(base: str, layer: int, manifest: dict | None = None, columns=None):
    """Layer `layer` of the store directory `base`, as its manifest committed it."""
    manifest = manifest if manifest is not None else (layout.read_manifest(base) or {})
    return read(base, manifest, layout.layer_key(layer), columns)


def spark_frame(spark, base: str, manifest: dict, key: str):
    """Layer `key` as a Spark DataFrame: each segment read by Spark, folded oldest to newest
    (an anti-join on id drops the rows a newer segment replaces or deletes)."""
    from pyspark.sql import functions as F

    chain = segments(base, manifest, key)
    if len(chain) == 1:
        return read_parquet(spark, *layout.spark_paths(base, manifest, key))
    frames = []
    for s in chain:
        listed = s.paths()
        frames.append(read_parquet(spark, *[layout.spark_uri(p) for p in (listed or [s.folder])]))
    merged = frames[0]
    for newer in frames[1:]:
        merged = merged.join(newer.select("id"), "id", "left_anti").unionByName(newer.where(F.col("h").isNotNull()))
    return merged


def base_problems(
    base: str, manifest: dict, key: str, verify: str = "checksums", columns: tuple = (), trusted=frozenset()
) -> list[str]:
    """Why the base segments of `key` are not the files they were when this version was
    committed over them (a deleted or rewritten older version), and why any segment's row file
    (rowfile.py) is not the one recorded. Segments whose folder is in `trusted` (checked by the
    caller already: a held version's, when its successor is opened) are not listed again."""
    chain = segments(base, manifest, key)
    found = rowfile.problems(chain[-1].folder, chain[-1].row_file, verify)
    for s in chain[:-1]:
        if s.folder in trusted:
            continue
        problems = integrity.problems(s.folder, s.recorded, verify, columns)
        problems += rowfile.problems(s.folder, s.row_file, verify)
        if problems:
            found.append(f"base segment of version {s.version[:12]} ({s.folder}): " + ", ".join(problems))
    return found


def should_compact(manifest: dict, key: str, changed_rows: int, total_rows: int) -> bool:
    """Whether a refresh writes layer `key` whole instead of as a delta over `manifest`'s layer."""
    too_long = len(bases(manifest, key)) + 2 > MAX_SEGMENTS
    return too_long or changed_rows >= COMPACT_FRACTION * max(total_rows, 1)


def delta_over(previous: dict, manifest: dict, key: str) -> bool:
    """Whether `manifest` commits layer `key` as a delta directly over `previous`'s layer: its
    base segments are exactly `previous`'s chain plus `previous`'s own committed attempt, or that
    chain rebased on a compacted segment of one of its versions (`rebased`). Then the layer's
    rows are `previous`'s rows with the rows of its own attempt (own_rows) laid on top."""
    chain = chain_over(previous, key)
    want = [(b["version"], b["path"]) for b in chain]
    have = [(b.get("version"), b.get("path")) for b in bases(manifest, key)]
    if not have:
        return False
    if have == want:
        return True
    first = bases(manifest, key)[0]
    if not first.get("compacted"):
        return False
    at = [i for i, b in enumerate(chain) if b["version"] == first.get("version") and not b.get("compacted")]
    return bool(at) and have[1:] == want[at[-1] + 1 :]


def write_compacted(base: str, manifest: dict, key: str) -> dict:
    """Write the merged rows of the committed layer `key` of the store version `base` (whose
    manifest is `manifest`) as one compacted segment in that version's folder (module doc), and
    return its `bases` entry. Reads only committed files and writes a fresh folder, so it may run
    beside a writer of later versions; a crash leaves an unreferenced folder, never a changed one."""
    import uuid

    from sparkgnn.arrowvec import parquet_options
    from sparkgnn.pe import parts

    table = read(base, manifest, key)
    rel = f"{COMPACTED_DIR}/{key}/{uuid.uuid4().hex}"
    folder = files.join(base, rel)
    crc = parts.write_parts(table, folder, parquet_options(table.schema, unique=("id",)))
    recorded = integrity.record(folder, crc)
    columns = {c: _vectors(table.column(c)) for c in ("h", "state") if c in table.column_names}
    version = str(manifest["graph_fingerprint"])
    row_file = rowfile.write(folder, table.column("id").to_numpy(), columns, key=key, version=version, parquet=recorded)
    return {"version": version, "path": rel, "files": recorded, "row_file": row_file, "compacted": True}


def _vectors(column) -> np.ndarray:
    """A column of equal-length float vectors (fixed or variable list) as float32 [n, w]."""
    chunks = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    flat = chunks.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(len(chunks), -1) if len(chunks) else flat.reshape(0, 0)


def rebased(chain: list[dict], compacted: dict) -> list[dict] | None:
    """`chain` (a delta's bases, oldest first) rebased on the compacted segment `compacted` of
    one of its versions: that segment, then the segments after that version's own; None when
    the version is not in the chain (or the result would not be shorter)."""
    at = [i for i, b in enumerate(chain) if b.get("version") == compacted["version"] and not b.get("compacted")]
    if not at:
        return None
    out = [compacted, *chain[at[-1] + 1 :]]
    return out if len(out) < len(chain) else None


def own_rows(base: str, manifest: dict, key: str, columns=None):
    """The rows of layer `key`'s own committed attempt alone, tombstones (null h) included, as a
    pyarrow.Table: for a delta layer, exactly what this version changed over its base."""
    wanted = None if columns is None else list(dict.fromkeys(["id", "h", *columns]))
    return _read_segment(segments(base, manifest, key)[-1], wanted)
