"""Writing the on-disk graph format, whole (write_graph_dir) or streamed in chunks (GraphDirWriter).

Why a streaming writer: synthetic graphs of tens of millions of edges are generated chunk by
chunk and must reach Parquet without ever existing as one array; the fingerprint is accumulated
on the way (it is an order-free sum of row hashes), and graph.json is written last by close().

Why staged: the Parquet folders are written into a hidden staging folder inside the target
(`<dir>/.sparkgnn-tmp-<uuid>/`) and moved into place by close(), so a writer that fails half way
(a full disk, an exception in a generator) leaves the previous graph, if any, as it was and no
truncated file behind (the writer is a context manager: an exception aborts it). An existing graph
is replaced only with overwrite=True, and only the folders this format owns are touched.
"""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.errors import OutputError
from sparkgnn.graph import layout
from sparkgnn.graph.checks import NO_SPLIT
from sparkgnn.graph.dirfacts import STAMP_KEY, data_stamp
from sparkgnn.graph.fingerprint import FingerprintAccumulator, edge_hash_sum, vertex_hash_sum
from sparkgnn.outputs import refuse_protected

_MASK = (1 << 64) - 1


class _RollingParquet:
    """Appends Arrow tables to part-NNNNN.parquet files, starting a new file every rows_per_file."""

    def __init__(self, folder: str, schema: pa.Schema, rows_per_file: int, row_group_rows: int):
        self.folder, self.schema = folder, schema
        self.rows_per_file = max(1, int(rows_per_file))
        self.row_group_rows = max(1, min(int(row_group_rows), self.rows_per_file))
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0
        self._files = 0
        os.makedirs(folder, exist_ok=True)

    def write(self, table: pa.Table) -> None:
        start = 0
        while start < table.num_rows:
            if self._writer is None:
                path = os.path.join(self.folder, f"part-{self._files:05d}.parquet")
                self._writer = pq.ParquetWriter(path, self.schema, compression="snappy")
                self._files += 1
            take = min(table.num_rows - start, self.rows_per_file - self._rows_in_file)
            self._writer.write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            self._rows_in_file += take
            start += take
            if self._rows_in_file >= self.rows_per_file:
                self._roll()

    def _roll(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer, self._rows_in_file = None, 0

    def close(self) -> None:
        self._roll()
        if self._files == 0:  # an empty table still needs one file so readers see the schema
            pq.write_table(self.schema.empty_table(), os.path.join(self.folder, "part-00000.parquet"))


class VertexSink:
    """One vertex table streamed to a Parquet folder (a graph's `vertices/`, or one node type's
    folder of a typed graph), with what graph.json needs accumulated on the way: the row count,
    the vertex half of the fingerprint (fingerprint.vertex_hash_sum), split counts, the largest
    label. A width of 0 writes no `x` column (a node type without features)."""

    def __init__(
        self, folder: str, feature_dim: int, *, has_labels: bool, has_split: bool, rows_per_file: int | None = None
    ):
        self.feature_dim = int(feature_dim)
        self.has_labels, self.has_split = has_labels, has_split
        row = layout.vertex_row_bytes(self.feature_dim)
        self._parquet = _RollingParquet(
            folder,
            layout.vertex_schema(self.feature_dim, has_labels, has_split),
            rows_per_file or layout.rows_for_bytes(row, layout.TARGET_FILE_BYTES),
            layout.rows_for_bytes(row, layout.TARGET_ROW_GROUP_BYTES),
        )
        self.count = 0
        self.hash_sum = 0
        self.split_counts = {"train": 0, "val": 0, "test": 0}
        self.max_label = -1

    def write(self, ids, x, y=None, split=None) -> None:
        """Append one chunk (x [N, F] float32; None when F is 0)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        x = np.zeros((len(ids), 0), np.float32) if x is None else np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.feature_dim or len(x) != len(ids):
            raise ValueError(f"vertex chunk x has shape {x.shape}; expected ({len(ids)}, {self.feature_dim})")
        columns = {"id": pa.array(ids)}
        if self.feature_dim:
            columns["x"] = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), self.feature_dim)
        if self.has_labels:
            y = np.ascontiguousarray(y, dtype=np.int64)
            columns["y"] = pa.array(y)
            if len(y):
                self.max_label = max(self.max_label, int(y.max()))
        if self.has_split:
            split = np.asarray(split).astype(str)
            columns["split"] = pa.array(split, mask=split == NO_SPLIT, type=pa.string())
            for key in self.split_counts:
                self.split_counts[key] += int(np.count_nonzero(split == key))
        self._parquet.write(pa.table(columns, schema=self._parquet.schema))
        self.count += len(ids)
        self.hash_sum = (self.hash_sum + vertex_hash_sum(ids, x)) & _MASK

    def close(self) -> None:
        self._parquet.close()


class EdgeSink:
    """One edge table streamed to a Parquet folder (a graph's `edges/`, or one relation's folder
    of a typed graph; edges by ORIGINAL ids), with its row count and the edge half of the
    fingerprint (fingerprint.edge_hash_sum) accumulated on the way."""

    def __init__(self, folder: str, *, has_weight: bool, edge_attr_dim: int = 0, rows_per_file: int | None = None):
        self.has_weight, self.edge_attr_dim = has_weight, int(edge_attr_dim)
        row = (20 if has_weight else 16) + 4 * self.edge_attr_dim
        self._parquet = _RollingParquet(
            folder,
            layout.edge_schema(has_weight, self.edge_attr_dim),
            rows_per_file or layout.rows_for_bytes(row, layout.TARGET_FILE_BYTES),
            layout.rows_for_bytes(row, layout.TARGET_ROW_GROUP_BYTES),
        )
        self.count = 0
        self.hash_sum = 0

    def write(self, src, dst, weight=None, edge_attr=None) -> None:
        """Append one chunk; weight and edge_attr must be given exactly when the sink has them."""
        src = np.ascontiguousarray(src, dtype=np.int64)
        dst = np.ascontiguousarray(dst, dtype=np.int64)
        columns = {"src": pa.array(src), "dst": pa.array(dst)}
        if self.has_weight:
            weight = np.ascontiguousarray(weight, dtype=np.float32)
            columns["weight"] = pa.array(weight)
        attr = None
        if self.edge_attr_dim:
            if edge_attr is None:
                raise ValueError(f"edge chunk has no edge_attr; this graph's edges carry {self.edge_attr_dim}")
            attr = np.ascontiguousarray(edge_attr, dtype=np.float32).reshape(len(src), -1)
            if attr.shape[1] != self.edge_attr_dim:
                raise ValueError(f"edge chunk edge_attr has width {attr.shape[1]}; expected {self.edge_attr_dim}")
            columns[layout.EDGE_ATTR] = pa.FixedSizeListArray.from_arrays(
                pa.array(attr.reshape(-1)), self.edge_attr_dim
            )
        elif edge_attr is not None:
            raise ValueError("edge chunk has edge_attr but the writer was opened with edge_attr_dim=0")
        self._parquet.write(pa.table(columns, schema=self._parquet.schema))
        self.count += len(src)
        self.hash_sum = (self.hash_sum + edge_hash_sum(src, dst, weight if self.has_weight else None, attr)) & _MASK

    def close(self) -> None:
        self._parquet.close()


_OWNED = (layout.VERTICES_DIR, layout.EDGES_DIR)


def check_target(path: str, overwrite: bool) -> None:
    """Refuse to replace a graph unless `overwrite`, and even then unless the folders it would
    replace are a graph's: graph.json is this format's commit marker, and a hidden staging folder
    of this writer marks a swap that was interrupted after graph.json went. Refuse a file where
    the directory goes, and `/`, the home directory or a mount point as the directory."""
    refuse_protected(path, flag="graph directory")
    targets = [os.path.join(path, p) for p in (*_OWNED, layout.META_FILE)]
    existing = [t for t in targets if os.path.exists(t)]
    if existing and not overwrite:
        raise OutputError(
            f"{path} already holds a graph ({', '.join(existing)}); pass overwrite=True (--overwrite) to replace it"
        )
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{path} is a file, not a graph directory")
    if existing and not _written_here(path):
        raise OutputError(
            f"{path} holds {', '.join(os.path.basename(t) for t in existing)} but no {layout.META_FILE}, so it "
            "is not a graph sparkgnn wrote and overwrite will not replace it; remove them yourself or choose a "
            "new directory"
        )


def _written_here(path: str) -> bool:
    """graph.json present, or this writer's staging folder (a swap interrupted after graph.json went)."""
    if os.path.isfile(os.path.join(path, layout.META_FILE)):
        return True
    return any(name.startswith(_STAGING_PREFIX) for name in os.listdir(path))


_STAGING_PREFIX = ".sparkgnn-tmp-"


def new_staging(path: str) -> str:
    """A hidden folder inside the graph directory to write the Parquet folders into."""
    return os.path.join(path, f"{_STAGING_PREFIX}{uuid.uuid4().hex}")


def swap_in(path: str, staging: str) -> None:
    """Replace the owned folders of `path` by the staged ones. graph.json goes first, so a crash
    mid-swap leaves a directory without graph.json: read as content-checked, never trusted."""
    meta = os.path.join(path, layout.META_FILE)
    if os.path.exists(meta):
        os.remove(meta)
    for name in _OWNED:
        final = os.path.join(path, name)
        if os.path.exists(final):
            os.rename(final, os.path.join(staging, f"old-{name}"))
        os.rename(os.path.join(staging, name), final)
    shutil.rmtree(staging, ignore_errors=True)


class GraphDirWriter:
    """Stream vertices and edges (edges by ORIGINAL ids) into a graph directory.

    The writer trusts its caller for global properties (unique ids, no dangling edges): it is fed
    either a validated GraphData or a generator that is correct by construction. It still refuses
    chunks of the wrong width.
    """

    def __init__(
        self,
        path: str,
        feature_dim: int,
        *,
        has_weight: bool = False,
        has_labels: bool = False,
        has_split: bool = False,
        edge_attr_dim: int = 0,
        name: str = "graph",
        rows_per_file: int | None = None,
        overwrite: bool = False,
    ):
        self.path = layout.strip_scheme(str(path))
        self.feature_dim, self.name = int(feature_dim), name
        self.has_weight, self.has_labels, self.has_split = has_weight, has_labels, has_split
        self.edge_attr_dim = int(edge_attr_dim)
        if self.edge_attr_dim < 0:
            raise ValueError(f"edge_attr_dim must be >= 0 (0: no edge attributes), got {edge_attr_dim}")
        check_target(self.path, overwrite)
        os.makedirs(self.path, exist_ok=True)
        self._staging = new_staging(self.path)
        self._vertices = VertexSink(
            os.path.join(self._staging, layout.VERTICES_DIR),
            self.feature_dim,
            has_labels=has_labels,
            has_split=has_split,
            rows_per_file=rows_per_file,
        )
        self._edges = EdgeSink(
            os.path.join(self._staging, layout.EDGES_DIR),
            has_weight=has_weight,
            edge_attr_dim=self.edge_attr_dim,
            rows_per_file=rows_per_file,
        )

    def write_vertices(self, ids, x, y=None, split=None) -> None:
        self._vertices.write(ids, x, y, split)

    def write_edges(self, src, dst, weight=None, edge_attr=None) -> None:
        self._edges.write(src, dst, weight, edge_attr)

    def close(self, *, num_classes: int | None = None, validated: bool = True, extra: dict | None = None) -> dict:
        """Finish the Parquet files, move them into place and write graph.json; returns the
        metadata written."""
        self._vertices.close()
        self._edges.close()
        swap_in(self.path, self._staging)
        fp = FingerprintAccumulator(self.feature_dim, self.has_weight, self.edge_attr_dim)
        fp.add_partial(self._vertices.count, self._vertices.hash_sum, self._edges.count, self._edges.hash_sum)
        meta = {
            "name": self.name,
            "num_vertices": fp.num_vertices,
            "num_edges": fp.num_edges,
            "feature_dim": self.feature_dim,
            "has_weight": self.has_weight,
            "has_labels": self.has_labels,
            "num_classes": int(num_classes if num_classes is not None else self._vertices.max_label + 1),
            "fingerprint": fp.hexdigest(),
            "fingerprint_algo": "sgfp1",
            "validated": bool(validated),
            "splits": dict(self._vertices.split_counts) if self.has_split else None,
            **({"edge_attr_dim": self.edge_attr_dim} if self.edge_attr_dim else {}),
            **(extra or {}),
            STAMP_KEY: data_stamp(self.path),
        }
        layout.write_meta(self.path, meta)
        return meta

    def abort(self) -> None:
        """Drop everything written so far; the target directory is left as it was."""
        for sink in (self._vertices, self._edges):
            try:
                sink.close()
            except OSError:  # the disk that failed the write may fail the close too
                pass
        shutil.rmtree(self._staging, ignore_errors=True)

    def __enter__(self) -> GraphDirWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def write_graph_dir(data, path: str, rows_per_file: int | None = None, overwrite: bool = False) -> dict:
    """Validate `data` (a GraphData) and write it as a graph directory; returns graph.json's content.

    rows_per_file caps rows per Parquet file (default: ~128 MB of raw data per file), which is
    how a caller controls the number of Spark input splits for small graphs.
    """
    data.validate()
    with GraphDirWriter(
        path,
        data.feature_dim,
        has_weight=data.has_weight,
        has_labels=data.has_labels,
        has_split=data.split is not None,
        edge_attr_dim=data.edge_attr_dim,
        name=data.name,
        rows_per_file=rows_per_file,
        overwrite=overwrite,
    ) as writer:
        writer.write_vertices(data.ids, data.x, data.y, data.split)
        writer.write_edges(data.src_ids, data.dst_ids, data.weight, data.edge_attr)
        return writer.close(num_classes=data.num_classes, validated=True)
