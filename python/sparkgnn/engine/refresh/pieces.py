"""The pieces of a graph (partition.py says what a piece holds), kept between refreshes.

WHY a cache: building the pieces with Spark (a distinct over every edge's source, a join of the
vertex table, two partitioned writes) is a large share of a refresh, and O(E) on every refresh.
But a refresh's tasks already hold the UPDATED graph's pieces in memory, so they write them
(pyarrow, no shuffle) and the driver adopts them under the updated graph's fingerprint. The next
refresh of that version starts from them: only its first refresh on a graph pays the Spark build.

    <work dir>/refresh-pieces/<graph fp>/P=<P>/
        vertices/part=<p>/*.parquet   id, x, [y], [split], owned   (owned vertices + their sources; x null
                                                               for a foreign one: read at its owner)
        edges/part=<p>/*.parquet      src, dst, [weight], [edge_attr]  (in-edges of owned vertices)
        local/part=<p>/*.parquet      id                           (the ids the piece holds)
        features/part=<p>.arrow       id, x, [y], [split]          (owned vertices, id sorted, Arrow IPC)
        pieces.json                   written last: the layout is complete

Keyed by what they hold (graph fingerprint and P), so a cached layout is never used for another
graph. A layout without its marker (a crashed build) is rebuilt. Adopting moves a folder
(`os.replace`). On a work dir that is not a local path the updated pieces are not kept, and
every refresh builds its pieces with Spark.
"""

from __future__ import annotations

import logging
import os
import shutil

from sparkgnn import files

MARKER = "pieces.json"
log = logging.getLogger(__name__)


def pieces_dir(work_dir: str, graph_fp: str, partitions: int) -> str:
    """`<work dir>/refresh-pieces/<graph fp>/P=<partitions>`; a malformed fingerprint is refused."""
    from sparkgnn.graph.fingerprint import check_fingerprint

    check_fingerprint(graph_fp, "refresh pieces: graph fingerprint")
    return files.join(work_dir, "refresh-pieces", graph_fp, f"P={int(partitions)}")


def complete(path: str) -> bool:
    return files.exists(files.join(path, MARKER))


def build(spark, graph, partitions: int, path: str) -> None:
    """The graph's pieces, written by Spark (partitionBy part), then the marker."""
    from pyspark.sql import functions as F

    from sparkgnn.engine.routing import partition_column

    def part_of(column: str):
        return partition_column(column, partitions)

    files.delete(path)  # an unmarked layout: a build that did not finish
    uri = files.spark_uri
    edges = graph.edges.withColumn("part", part_of("dst"))
    local = (
        graph.vertices.select("id", part_of("id").alias("part"))
        .unionByName(edges.select(F.col("src").alias("id"), "part"))
        .distinct()
    )
    local.write.partitionBy("part").parquet(uri(files.join(path, "local")))
    local = spark.read.schema("id long, part int").parquet(uri(files.join(path, "local")))
    owned = F.col("part") == part_of("id")
    (
        local.join(graph.vertices, "id")
        .withColumn("owned", owned)
        .withColumn("x", F.when(owned, F.col("x")))  # a foreign vertex's features: at its owner
        .write.partitionBy("part")
        .parquet(uri(files.join(path, "vertices")))
    )
    edges.write.partitionBy("part").parquet(uri(files.join(path, "edges")))
    if files.is_local(path):  # the owners' features, row-addressable (routing.owner_rows)
        import functools

        fn = functools.partial(write_features_task, path)
        spark.range(0, partitions, 1, partitions).mapInArrow(fn, "part int").collect()
    files.write_json_atomic(files.join(path, MARKER), {"partitions": int(partitions), "built_by": "spark"})


def write_features_task(path: str, batches):
    """One task per part: the part's owned vertices (id, x[, y][, split]) sorted by id, as the
    Arrow IPC file features/part=<p>.arrow that other pieces' tasks map and take rows from."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from sparkgnn.engine.refresh.partition import write_features
    from sparkgnn.engine.refresh.rundir import slice_files

    for batch in batches:
        for part in batch.column(0).to_pylist():
            paths = slice_files(files.join(path, "vertices"), int(part))
            fs = files.filesystem(path)[0]
            read = [pq.read_table(files.filesystem(p)[1], filesystem=fs, partitioning=None) for p in paths]
            found = pa.concat_tables(read, promote_options="default") if read else None
            if found is not None and found.num_rows:
                table = found.filter(found.column("owned"))
                table = table.select([n for n in ("id", "x", "y", "split") if n in table.column_names])
                write_features(path, int(part), table.take(pc.sort_indices(table, [("id", "ascending")])))
            yield pa.RecordBatch.from_pydict({"part": pa.array([int(part)], pa.int32())})


def adopt(next_dir: str, path: str) -> bool:
    """Keep the pieces a refresh's tasks wrote for the updated graph (`next_dir`) as its layout.
    False (nothing kept) where the work dir is not local, or the layout exists already."""
    if not files.is_local(next_dir) or complete(path):
        return False
    source, target = files.filesystem(next_dir)[1], files.filesystem(path)[1]
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)
    files.write_json_atomic(files.join(path, MARKER), {"built_by": "refresh"})
    log.info(f"sparkgnn refresh: the updated graph's pieces kept for its next refresh ({path})")
    return True
