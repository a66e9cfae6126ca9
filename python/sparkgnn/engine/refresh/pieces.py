"""The pieces of a graph (partition.py says what a piece holds), kept between refreshes.

WHY a cache: building the pieces with Spark (a distinct over every edge's source, a join of the
vertex table, two partitioned writes) is a large share of a refresh, and O(E) on every refresh.
But a refresh's tasks already hold the UPDATED graph's pieces in memory, so they write them
(pyarrow, no shuffle) and the driver adopts them under the updated graph's fingerprint. The next
refresh of that version starts from them: only its first refresh on a graph pays the Spark build.

    <work dir>/refresh-pieces/<graph fp>/P=<P>/
        vertices/part=<p>/*.parquet   id, x, [y], [split], owned   (owned vertices + their sources)
        edges/part=<p>/*.parquet      src, dst, [weight], [edge_attr]  (in-edges of owned vertices)
        local/part=<p>/*.parquet      id                           (the ids the piece holds)
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
    (
        local.join(graph.vertices, "id")
        .withColumn("owned", F.col("part") == part_of("id"))
        .write.partitionBy("part")
        .parquet(uri(files.join(path, "vertices")))
    )
    edges.write.partitionBy("part").parquet(uri(files.join(path, "edges")))
    files.write_json_atomic(files.join(path, MARKER), {"partitions": int(partitions), "built_by": "spark"})


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
