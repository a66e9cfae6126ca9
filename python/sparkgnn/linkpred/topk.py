"""Top-k candidates per source node across Spark tasks (exact), from the node outputs (id, h).

When the candidates' outputs fit in scoring.BROADCAST_BYTES (and the session has broadcast
variables), they are collected once as a NodeTable and broadcast; each task streams its sources'
Arrow batches past every candidate in cache-sized tiles with a running per-source top-k
(`broadcast_topk`, tiles.table_topk), so a source's final list is made in one task: no cross join,
no partial lists, no merge shuffle, no row larger than one source's output and exclusion list.
WHY not the blocks below at that size: they make each candidate tile one Spark row that travels,
once per source block, through the driver JVM's row sorter (local mode), which ran out of heap at
800K 128-d candidates whatever the partition count.

Otherwise (outputs over the budget, or Spark Connect) sources and candidates are hashed into blocks
(collect_list of ids and outputs per block); the cross join of source blocks and candidate tiles
makes one row per (block, tile) unit of work, spread over the partitions; each unit scores its tile
and keeps each source's k best (tiles.tile_topk), and the partial lists are shuffled by source and
merged (tiles.merge_topk: exact, see tiles.py). WHY `block_count` sizes the blocks by bytes rather
than by partitions alone: a block is one row, which Spark's aggregation, row sorter and shuffle
hold whole in the JVM (the driver's heap in local mode), and the cross join ships every tile once
per source block; a large graph cut into only as many tiles as tasks makes rows of hundreds of MB
that exhaust that heap, so each side is cut into more blocks until one holds at most about
BLOCK_BYTES of outputs. With `exclude` (the graph's edges), a source's known neighbours are never
returned: each source block carries its own out-edges. Output (src long, dst long, score float,
rank int), score = the decoder's final score, rank 1 = best. A per-relation decoder ranks once per
relation (`per_relation_topk_frame`), adding a relation column.

The broadcast's lifetime is the caller's: the frames returned read it lazily, whenever they are
written or collected, so it cannot be released when they are made. Inside `broadcast_scope()`
every broadcast share_outputs makes is destroyed when the block exits (the jobs write their
output inside one); outside it a broadcast lives until the session stops.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.decoders import Decoder, RelationalDecoder
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.payload import DecoderPayload
from sparkgnn.linkpred.scoring import BROADCAST_BYTES
from sparkgnn.linkpred.tiles import check_device, merge_topk, resolve_device, table_topk, tile_topk

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

PARTIAL_SCHEMA = "src long, dst long, score float"
TOPK_SCHEMA = "src long, dst long, score float, rank int"
COLLECT_BYTES = 64 << 20  # node outputs one collect of share_outputs brings to the driver at most
SOURCE_ROWS = 512  # sources scored together against each candidate tile on the broadcast path
BLOCK_BYTES = 32 << 20  # outputs (ids and float32 vectors) one source block or candidate tile holds at most, about
_SCOPE: contextvars.ContextVar[list | None] = contextvars.ContextVar("sparkgnn_linkpred_broadcasts", default=None)


@contextlib.contextmanager
def broadcast_scope() -> Iterator[None]:
    """Destroy, when the block exits, every broadcast share_outputs makes inside it (module doc):
    write or collect the frames that read them inside the block."""
    owned: list = []
    token = _SCOPE.set(owned)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        for shared in owned:
            shared.destroy()


def check_k(k: int) -> int:
    """`k` if it is >= 1, else ValueError (one line)."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return int(k)


def block_count(nodes: DataFrame, partitions: int, *, block_bytes: int = BLOCK_BYTES) -> int:
    """How many blocks `blocks` cuts `nodes` (id, h) into: `partitions`, or more where a block would
    otherwise hold over `block_bytes` of ids and float32 outputs (module doc). One Spark action: a
    count and the widest output (the node outputs are materialised, so this reads them once)."""
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes!r}")
    return blocks_for(output_shape(nodes), partitions, block_bytes=block_bytes)


def restricted(nodes: DataFrame, wanted: DataFrame | None) -> DataFrame:
    """`nodes` (id, h) whose id is in `wanted` (an `id` frame; None: all). WHY the ids are the
    broadcast side, hinted: Spark may otherwise broadcast the node outputs themselves (their
    materialised size can look small to it), holding every output in the driver JVM next to the
    candidate table's broadcast."""
    from pyspark.sql import functions as F

    if wanted is None:
        return nodes
    return nodes.join(F.broadcast(wanted.select("id")), on="id", how="left_semi")


def output_shape(nodes: DataFrame) -> tuple[int, int]:
    """(rows, widest output) of `nodes` (id, h): one Spark action."""
    from pyspark.sql import functions as F

    rows, width = nodes.agg(F.count(F.lit(1)).alias("rows"), F.max(F.size("h")).alias("width")).collect()[0]
    return int(rows), int(width or 0)


def blocks_for(shape: tuple[int, int], partitions: int, *, block_bytes: int = BLOCK_BYTES) -> int:
    """block_count of outputs of `shape` (rows, width) already measured."""
    if block_bytes < 1:
        raise ValueError(f"block_bytes must be >= 1, got {block_bytes!r}")
    rows, width = shape
    return max(partitions, math.ceil(rows * (8 + 4 * width) / block_bytes))


def outputs_bytes(shape: tuple[int, int]) -> int:
    """Bytes of (rows, width) node outputs as a NodeTable holds them (int64 id, float32 vector)."""
    return shape[0] * (8 + 4 * shape[1])


def share_outputs(
    nodes: DataFrame, shape: tuple[int, int], *, broadcast_bytes: int = BROADCAST_BYTES
) -> Broadcast | None:
    """`nodes` (id, h) collected as a NodeTable and broadcast when its `shape` fits in
    `broadcast_bytes` and the session has broadcast variables (not Spark Connect); None otherwise.
    WHY collected in pieces of about COLLECT_BYTES: a collect holds every task's result in the
    driver JVM at once, next to the broadcast's own copy there."""
    from sparkgnn.engine.spark_compat import has_jvm
    from sparkgnn.linkpred.scoring import NodeTable

    spark = nodes.sparkSession
    if not has_jvm(spark) or outputs_bytes(shape) > broadcast_bytes:
        return None
    started = time.perf_counter()
    from pyspark.sql import functions as F

    pieces = max(1, math.ceil(outputs_bytes(shape) / COLLECT_BYTES))
    piece = F.pmod(F.xxhash64("id"), F.lit(pieces))
    arrow = pa.concat_tables([nodes.where(piece == j).select("id", "h").toArrow() for j in range(pieces)])
    table = NodeTable.from_arrow(arrow)
    del arrow
    shared = spark.sparkContext.broadcast(table)
    scope = _SCOPE.get()
    if scope is not None:
        scope.append(shared)
    log.info(
        f"linkpred: {len(table.ids):,} candidate outputs ({table.h.nbytes / 2**20:.0f} MiB) collected and broadcast "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return shared


def source_rows(src_nodes: DataFrame, exclude: DataFrame | None, partitions: int) -> DataFrame:
    """(id, h[, ex_dst]) of the sources, each with the dsts of its `exclude` pairs (null: none),
    in at least `partitions` partitions (hash by id where the input has fewer)."""
    from pyspark.sql import functions as F

    rows = src_nodes.select("id", "h")
    if exclude is not None:
        ex = (
            exclude.select(F.col("src").cast("long").alias("id"), F.col("dst").cast("long").alias("dst"))
            .join(src_nodes.select("id"), on="id", how="left_semi")
            .groupBy("id")
            .agg(F.collect_list("dst").alias("ex_dst"))
        )
        rows = rows.join(ex, on="id", how="left")
    if rows.rdd.getNumPartitions() < partitions:
        rows = rows.repartition(partitions, "id")
    return rows


def batch_exclusions(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray] | None:
    """(src, dst) pairs a source_rows batch excludes (its ex_dst lists), None when none."""
    if "ex_dst" not in batch.schema.names:
        return None
    lists = batch.column("ex_dst")
    counts = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    if not counts.sum():
        return None
    return np.repeat(ids(batch.column("id")), counts), ids(lists.flatten())


def cross_units(s_blocks: DataFrame, c_blocks: DataFrame) -> DataFrame:
    """Every (source block, candidate tile) pair as one row: a cartesian product, never a broadcast.
    WHY the hint: Spark may otherwise broadcast a side, building every tile of it in the driver at
    once, which is the unbounded memory that block_count's sizing exists to avoid."""
    return s_blocks.hint("shuffle_replicate_nl").crossJoin(c_blocks.hint("shuffle_replicate_nl"))


def blocks(nodes: DataFrame, count: int, prefix: str) -> DataFrame:
    """(<prefix>block, <prefix>ids, <prefix>hs): `nodes` (id, h) hashed into `count` blocks."""
    from pyspark.sql import functions as F

    return (
        nodes.withColumn(f"{prefix}block", F.pmod(F.xxhash64("id"), F.lit(count)).cast("int"))
        .groupBy(f"{prefix}block")
        .agg(F.collect_list("id").alias(f"{prefix}ids"), F.collect_list("h").alias(f"{prefix}hs"))
    )


def _unit(row_batch: pa.RecordBatch, i: int, excluding: bool):
    src_ids = ids(row_batch.column("s_ids")[i].values)
    sources = matrix(row_batch.column("s_hs")[i].values)
    cand_ids = ids(row_batch.column("c_ids")[i].values)
    candidates = matrix(row_batch.column("c_hs")[i].values)
    exclude = None
    if excluding:
        ex_src, ex_dst = row_batch.column("ex_src")[i], row_batch.column("ex_dst")[i]
        if ex_src.is_valid:
            exclude = (ids(ex_src.values), ids(ex_dst.values))
    return src_ids, sources, cand_ids, candidates, exclude


def topk_frame(
    nodes: DataFrame,
    decoder: Decoder,
    k: int,
    *,
    sources: DataFrame | None = None,
    candidates: DataFrame | None = None,
    exclude: DataFrame | None = None,
    partitions: int = 2,
    block_bytes: int = BLOCK_BYTES,
    broadcast_bytes: int = BROADCAST_BYTES,
    device: str = "cpu",
) -> DataFrame:
    """Exact top-k (module doc). `sources` / `candidates`: `id` frames restricting each side (None:
    every node); `exclude`: (src, dst) pairs never returned; `partitions`: the fewest source blocks
    and candidate tiles each (more where one would exceed `block_bytes`, see block_count) and the
    merge's partitions; the units of work (blocks x tiles) spread over at least partitions^2 tasks.
    Candidates of at most `broadcast_bytes` take the broadcast path instead (module doc), the
    sources then in at least `partitions` tasks. `device`: where the tasks score and select
    ("cuda": each task's tiles on its GPU, tiles.py; a task that sees none fails naming it)."""
    k = check_k(k)
    device = check_device(device)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    payload = DecoderPayload.of(decoder)
    src_nodes, cand_nodes = restricted(nodes, sources), restricted(nodes, candidates)
    c_shape = output_shape(cand_nodes)
    shared = share_outputs(cand_nodes, c_shape, broadcast_bytes=broadcast_bytes)
    if shared is not None:
        return broadcast_topk(shared, source_rows(src_nodes, exclude, partitions), payload, k, device=device)
    log.info(
        f"topk: {c_shape[0]:,} candidate outputs ({outputs_bytes(c_shape) >> 20} MiB) exceed the broadcast budget "
        f"({broadcast_bytes >> 20} MiB) or the session has no broadcast: source blocks x candidate tiles"
    )
    s_count = block_count(src_nodes, partitions, block_bytes=block_bytes)
    c_count = blocks_for(c_shape, partitions, block_bytes=block_bytes)
    s_blocks = blocks(src_nodes, s_count, "s_")
    c_blocks = blocks(cand_nodes, c_count, "c_")
    excluding = exclude is not None
    if exclude is not None:
        s_blocks = s_blocks.join(exclusions(exclude, src_nodes, s_count), on="s_block", how="left")
    units = cross_units(s_blocks, c_blocks).repartition(max(partitions * partitions, s_count * c_count))

    def score_units(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            for i in range(len(batch)):
                src_ids, srcs, cand_ids, cands, excl = _unit(batch, i, excluding)
                src, dst, score = tile_topk(built, src_ids, srcs, cand_ids, cands, k, excl, device=device)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(src), pa.array(dst), pa.array(score, pa.float32())], names=["src", "dst", "score"]
                )

    return merge_partial(units.mapInArrow(score_units, PARTIAL_SCHEMA), payload, k, partitions)


def map_source_slices(
    shared: Broadcast,
    rows: DataFrame,
    payload: DecoderPayload,
    schema: str,
    answer: Callable[[Any, Any, pa.RecordBatch], pa.RecordBatch],
) -> DataFrame:
    """`rows.mapInArrow` answering SOURCE_ROWS sources of an Arrow batch at a time with
    `answer(built decoder, the broadcast NodeTable, the slice)`: the broadcast paths of top-k and of
    full-ranking evaluation. A task builds the decoder once and runs torch on one thread (Spark
    runs a task per core)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        table = shared.value
        for batch in batches:
            for start in range(0, len(batch), SOURCE_ROWS):
                yield answer(built, table, batch.slice(start, SOURCE_ROWS))

    return rows.mapInArrow(run, schema)


def broadcast_topk(
    shared: Broadcast, rows: DataFrame, payload: DecoderPayload, k: int, *, device: str = "cpu"
) -> DataFrame:
    """TOPK_SCHEMA of every source in `rows` (source_rows) against every candidate of the broadcast
    NodeTable `shared`: each task streams its sources' Arrow batches past the candidates
    (tiles.table_topk on `device`; map_source_slices), so a source's final list is made in one task
    (no partial lists, no merge shuffle) and nothing larger than one Arrow batch of sources moves in
    Spark. On a GPU the candidates go to the device once per task: `moved` is made anew when a
    task unpickles this closure, so the copy lives as long as the task that reads it."""
    moved: dict = {}

    def answer(built, table, part: pa.RecordBatch) -> pa.RecordBatch:
        candidates = table.h
        if device != "cpu":
            if "h" not in moved:
                moved["h"] = torch.from_numpy(table.h).to(resolve_device(device))
            candidates = moved["h"]
        src, dst, raw, rank = table_topk(
            built,
            ids(part.column("id")),
            matrix(part.column("h")),
            table.ids,
            candidates,
            k,
            batch_exclusions(part),
            device=device,
        )
        score = built.apply_final(torch.from_numpy(raw)).numpy().astype(np.float32)
        return pa.RecordBatch.from_arrays(
            [pa.array(src), pa.array(dst), pa.array(score, pa.float32()), pa.array(rank, pa.int32())],
            names=["src", "dst", "score", "rank"],
        )

    return map_source_slices(shared, rows, payload, TOPK_SCHEMA, answer)


def per_relation_topk_frame(
    nodes: DataFrame,
    decoder: RelationalDecoder,
    k: int,
    relations: Sequence[int | str],
    **options,
) -> DataFrame:
    """Exact top-k of a per-relation decoder (DistMult, TransE) once per relation in `relations`
    (indices or names): (src, relation, dst, score, rank), the relation as named in `relations`
    (long when they are indices, else string). Each relation runs `topk_frame` with the decoder
    bound to it (decoders/relational.py), so ties and exclusions behave as there; `options` are
    topk_frame's."""
    from pyspark.sql import functions as F

    if not relations:
        raise ValueError("per-relation top-k needs at least one relation")
    kind = "string" if any(isinstance(r, str) for r in relations) else "long"
    frames = [
        topk_frame(nodes, decoder.bind(r), k, **options)
        .withColumn("relation", F.lit(str(r) if kind == "string" else int(r)).cast(kind))
        .select("src", "relation", "dst", "score", "rank")
        for r in relations
    ]
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def exclusions(exclude: DataFrame, src_nodes: DataFrame, count: int) -> DataFrame:
    """(s_block, ex_src, ex_dst): the (src, dst) pairs of `exclude` whose src is a source, grouped
    by the source block `blocks(src_nodes, count, "s_")` puts that src in."""
    from pyspark.sql import functions as F

    return (
        exclude.select(F.col("src").cast("long").alias("src"), F.col("dst").cast("long").alias("dst"))
        .join(src_nodes.select(F.col("id").alias("src")), on="src")
        .withColumn("s_block", F.pmod(F.xxhash64("src"), F.lit(count)).cast("int"))
        .groupBy("s_block")
        .agg(F.collect_list("src").alias("ex_src"), F.collect_list("dst").alias("ex_dst"))
    )


def merge_partial(partial: DataFrame, payload: DecoderPayload, k: int, partitions: int) -> DataFrame:
    """The final top-k (TOPK_SCHEMA) of partial lists (PARTIAL_SCHEMA, raw scores): shuffled by
    source, merged (tiles.merge_topk), the decoder's `final` applied to the kept scores."""

    def merge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        table = pa.Table.from_batches(
            list(batches), schema=pa.schema([("src", pa.int64()), ("dst", pa.int64()), ("score", pa.float32())])
        )
        src, dst, raw, rank = merge_topk(
            ids(table.column("src")),
            ids(table.column("dst")),
            table.column("score").to_numpy().astype(np.float32),
            k,
        )
        built = payload.build()
        score = built.apply_final(torch.from_numpy(raw)).numpy().astype(np.float32)
        yield pa.RecordBatch.from_arrays(
            [pa.array(src), pa.array(dst), pa.array(score, pa.float32()), pa.array(rank, pa.int32())],
            names=["src", "dst", "score", "rank"],
        )

    return partial.repartition(partitions, "src").mapInArrow(merge, TOPK_SCHEMA)
