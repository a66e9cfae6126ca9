"""The run directory a partitioned refresh's tasks share (job.py lists it): what every task is
told (RunContext), the run's metadata (run.json: feature width, vertex and edge columns) and the
Parquet slices Spark wrote partitioned by `part`. Everything here reads or writes that directory
only, so a task lost with its executor reruns anywhere."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sparkgnn import files
from sparkgnn.graph.updates.format import EDGE_ATTR_FIELD
from sparkgnn.pe.rowfile import LayerRows, layer_rows


@dataclass(frozen=True)
class RunContext:
    """What every task of a refresh is told (pickled into its closure)."""

    run_dir: str
    pieces_dir: str  # the old graph's pieces (pieces.py): vertices/, edges/, local/
    partitions: int
    model_store: str
    model_fingerprint: str
    stat_keys: tuple  # ((key, stat name, weighted), ...)
    # ((layer, layer key, (versions.Segment, ...)), ...) for every layer of the old store when each
    # of its segments has a row file (pe/rowfile.py): the compute tasks read the values they need
    # from them directly (no plan round, no fetch); () where one has none: the driver fetches them
    store_rows: tuple = ()
    # the update's Parquet folder: every round-0 task reads it whole and keeps the rows its piece
    # concerns (route_update), instead of Spark routing them in jobs before the round
    update_path: str = ""
    update_files: tuple = ()  # its data files as the driver listed them (file_marks)

    def layer_rows(self, layer: int) -> LayerRows:
        """The old store's layer `layer`, readable row by row from its segments' row files."""
        for l, key, segments in self.store_rows:
            if l == layer:
                rows = layer_rows(list(segments), key, f"PE store layer {layer} (row files)")
                if rows is not None:
                    return rows
        raise ValueError(f"layer {layer}: the PE store's layer has no row files to read from")


def slice_files(folder: str, part: int) -> list[str]:
    """Parquet files of partition `part` of a folder Spark wrote with partitionBy("part")."""
    path = files.join(folder, f"part={part}")
    fs, inner = files.filesystem(path)
    infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))
    return sorted(
        files.join(path, i.base_name)
        for i in infos
        if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
    )


def read_slice(folder: str, part: int, schema: pa.Schema) -> pa.Table:
    """Partition `part`'s rows of `folder` (an empty table of `schema` when Spark wrote none)."""
    paths = slice_files(folder, part)
    if not paths:
        return schema.empty_table()
    fs = files.filesystem(paths[0])[0]
    table = pa.concat_tables(
        [pq.read_table(files.filesystem(p)[1], filesystem=fs, partitioning=None) for p in paths],
        promote_options="default",
    )
    table = table.select([n for n in schema.names if n in table.column_names])
    # Spark names a list's item "element", pyarrow "item": one schema for slices of both writers
    return table.cast(pa.schema([schema.field(n) for n in table.column_names]))


def write_piece_file(path: str, table: pa.Table) -> None:
    """One task output file; a retried task rewrites it whole (readers run after the stage)."""
    files.makedirs(files.parent(path))
    fs, inner = files.filesystem(path)
    with fs.open_output_stream(inner) as sink:
        pq.write_table(table, sink)


def layer_dir(run_dir: str, layer: int, what: str) -> str:
    return files.join(run_dir, f"layer={layer}", what)


def run_meta(run_dir: str) -> dict:
    return _META.setdefault(run_dir, files.read_json(files.join(run_dir, "run.json")))


_META: dict = {}


def feature_dim(run_dir: str) -> int:
    return int(run_meta(run_dir)["feature_dim"])


def vertex_schema(run_dir: str) -> pa.Schema:
    optional = {"y": pa.int64(), "split": pa.string()}
    present = [(name, t) for name, t in optional.items() if name in run_meta(run_dir)["vertex_columns"]]
    return pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32())), *present, ("owned", pa.bool_())])


def edge_attr_dim(run_dir: str) -> int:
    """Width of the graph's edge attributes (0: its edges carry none)."""
    return int(run_meta(run_dir).get("edge_attr_dim", 0))


def edge_schema(run_dir: str) -> pa.Schema:
    fields = [pa.field("src", pa.int64()), pa.field("dst", pa.int64())]
    if run_meta(run_dir)["weighted"]:
        fields.append(pa.field("weight", pa.float32()))
    if edge_attr_dim(run_dir):
        fields.append(EDGE_ATTR_FIELD)
    return pa.schema(fields)
