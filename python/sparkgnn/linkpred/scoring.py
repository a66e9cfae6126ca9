"""Scoring node pairs: the decoder run over Arrow batches of pairs, each pair given its two node outputs.

`nodes` (id, h) is the batch path's result (sparkgnn.infer, embedding output), `pairs` (src, dst[,
relation]); output (src long, dst long[, relation as given], score float). Two ways to bring the
outputs to the pairs:
- `score_pairs_broadcast`: the node outputs, collected once as a NodeTable (ids sorted, [N, F]
  matrix) and broadcast, are gathered by position inside each Arrow batch of pairs (a binary
  search per id). The pairs are read once and never shuffled: two shuffle joins would move every
  pair's two 4F-byte outputs through the shuffle, ~10 GB for 10M pairs of 128-d outputs.
- `score_pairs`: two joins in Spark, for outputs over BROADCAST_BYTES or a session without
  broadcast variables (Spark Connect).
`write_scores` picks one, writes staged, and refuses the pairs (nothing written) when fewer rows
came out than pairs went in: a pair with a null id or an id without an output is left out by both
ways, so that count is the job's one check of the pairs' ids (pairs.refuse_bad_pairs names them).
The decoder travels as config + arrays (payload.py) and is rebuilt once per Python worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.decoders import Decoder
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.pairs import RELATION, PairsError, refuse_bad_pairs
from sparkgnn.linkpred.payload import DecoderPayload

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

SCORE_SCHEMA = "src long, dst long, score float"


def score_batch(decoder: Decoder, batch: pa.RecordBatch) -> pa.RecordBatch:
    """(src, dst[, relation], h_src, h_dst) -> (src, dst[, relation], score); the relation column
    (per-relation decoders) is passed to the decoder and kept as given."""
    h_src = torch.from_numpy(matrix(batch.column("h_src")))
    h_dst = torch.from_numpy(matrix(batch.column("h_dst")))
    names = ["src", "dst"]
    columns = [pa.array(ids(batch.column("src"))), pa.array(ids(batch.column("dst")))]
    rel = None
    if RELATION in batch.schema.names:
        rel = batch.column(RELATION).to_numpy(zero_copy_only=False)
        names.append(RELATION)
        columns.append(batch.column(RELATION))
    scores = decoder(h_src, h_dst, rel).numpy().astype(np.float32) if len(batch) else np.zeros(0, np.float32)
    return pa.RecordBatch.from_arrays([*columns, pa.array(scores)], names=[*names, "score"])


def score_pairs(nodes: DataFrame, pairs: DataFrame, decoder: Decoder) -> DataFrame:
    """(src, dst[, relation], score) of every pair (module doc); the pairs' ids must be in `nodes`,
    and they carry a relation column exactly when the decoder is per-relation."""
    from pyspark.sql import functions as F

    payload = DecoderPayload.of(decoder)
    src = nodes.select(F.col("id").alias("src"), F.col("h").alias("h_src"))
    dst = nodes.select(F.col("id").alias("dst"), F.col("h").alias("h_dst"))
    keys = ["src", "dst", RELATION] if RELATION in pairs.columns else ["src", "dst"]
    joined = pairs.join(src, on="src").join(dst, on="dst").select(*keys, "h_src", "h_dst")
    schema = _schema(pairs)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            yield score_batch(built, batch)

    return joined.mapInArrow(run, schema)


def _schema(pairs: DataFrame) -> str:
    if RELATION in pairs.columns:
        return f"src long, dst long, {RELATION} {pairs.schema[RELATION].dataType.simpleString()}, score float"
    return SCORE_SCHEMA


# Node outputs shipped whole to every scoring task at most: collecting them passes through
# spark.driver.maxResultSize (1 GiB by default) and each Python worker holds one copy. Above it the
# pairs are scored through two shuffle joins (score_pairs).
BROADCAST_BYTES = 768 << 20


@dataclass(frozen=True)
class NodeTable:
    """Node outputs by position: `ids` ascending (int64) and row i of `h` ([N, F] float32) the
    output of ids[i], so a batch of pairs finds its rows by a binary search, not a join."""

    ids: np.ndarray
    h: np.ndarray

    @classmethod
    def from_arrow(cls, table: pa.Table) -> NodeTable:
        """From an Arrow table (id, h) in any row order; ValueError for an id named twice."""
        node_ids = ids(table.column("id"))
        order = np.argsort(node_ids, kind="stable")
        node_ids = node_ids[order]
        if len(node_ids) > 1 and bool((node_ids[1:] == node_ids[:-1]).any()):
            raise ValueError("the node outputs name an id twice")
        return cls(node_ids, np.ascontiguousarray(matrix(table.column("h"))[order]))

    def positions(self, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each query id, whether the table has the id); an absent id's row is 0."""
        if not len(self.ids):
            return np.zeros(len(query), np.int64), np.zeros(len(query), bool)
        rows = np.searchsorted(self.ids, query)
        np.minimum(rows, len(self.ids) - 1, out=rows)
        return rows, self.ids[rows] == query


def score_gathered(decoder: Decoder, table: NodeTable, batch: pa.RecordBatch) -> pa.RecordBatch:
    """(src, dst[, relation]) -> (src, dst[, relation], score), each pair's outputs gathered from
    `table` by position. A pair with a null id or an id the table lacks is left out (never scored
    against anything): write_scores counts the rows and refuses the pairs."""
    src_col, dst_col = batch.column("src"), batch.column("dst")
    keep = np.ones(len(batch), bool)
    if src_col.null_count or dst_col.null_count:
        keep &= np.asarray(src_col.is_valid()) & np.asarray(dst_col.is_valid())
        src_col, dst_col = src_col.fill_null(0), dst_col.fill_null(0)
    src, dst = ids(src_col), ids(dst_col)
    src_rows, src_known = table.positions(src)
    dst_rows, dst_known = table.positions(dst)
    keep &= src_known & dst_known
    if not keep.all():
        batch = batch.filter(pa.array(keep))
        src, dst, src_rows, dst_rows = src[keep], dst[keep], src_rows[keep], dst_rows[keep]
    names = ["src", "dst"]
    columns = [pa.array(src), pa.array(dst)]
    rel = None
    if RELATION in batch.schema.names:
        rel = batch.column(RELATION).to_numpy(zero_copy_only=False)
        names.append(RELATION)
        columns.append(batch.column(RELATION))
    scores = np.zeros(0, np.float32)
    sides = table_projections(decoder, table) if rel is None else None
    if len(batch) and sides is not None:  # per-node halves: gathered and added, no per-pair product
        with torch.no_grad():
            raw = decoder.raw_projected(torch.from_numpy(sides[0][src_rows]), torch.from_numpy(sides[1][dst_rows]))
            scores = decoder.apply_final(raw).numpy().astype(np.float32, copy=False)
    elif len(batch):
        h_src, h_dst = torch.from_numpy(table.h[src_rows]), torch.from_numpy(table.h[dst_rows])
        scores = decoder(h_src, h_dst, rel).numpy().astype(np.float32, copy=False)
    return pa.RecordBatch.from_arrays([*columns, pa.array(scores)], names=[*names, "score"])


_projected: list = []  # [NodeTable, Decoder, (source side, destination side)]: the last table's


def table_projections(decoder: Decoder, table: NodeTable) -> tuple[np.ndarray, np.ndarray] | None:
    """The decoder's per-node projections of every row of `table` (Decoder.project), or None when
    it has none. Made once per Python worker, table and decoder (a worker's tasks share the
    broadcast table and the payload's built decoder), the last one kept."""
    if _projected and _projected[0] is table and _projected[1] is decoder:
        return _projected[2]
    decoder.check_width(table.h.shape[1])
    with torch.no_grad():
        sides = decoder.project(torch.from_numpy(table.h))
    if sides is None:
        return None
    _projected[:] = [table, decoder, (sides[0].numpy(), sides[1].numpy())]
    return _projected[2]


def score_pairs_broadcast(shared: Broadcast, pairs: DataFrame, decoder: Decoder) -> DataFrame:
    """(src, dst[, relation], score) of every pair whose ids are both in the broadcast NodeTable
    `shared` (loaded once per Python worker), scored in the pairs' own Arrow batches: no join, no
    shuffle. Pairs with a null or absent id are left out (score_gathered)."""
    payload = DecoderPayload.of(decoder)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        table = shared.value
        for batch in batches:
            yield score_gathered(built, table, batch)

    return pairs.mapInArrow(run, _schema(pairs))


def write_scores(
    spark: SparkSession,
    nodes: DataFrame,
    pairs: DataFrame,
    decoder: Decoder,
    out: str,
    *,
    pair_count: int,
    node_count: int,
    vertices: DataFrame,
    what: str,
) -> int:
    """Score every pair (module doc) into Parquet under `out` (staged, then swapped in); returns the
    rows written, which equal `pair_count`. `node_count` rows of `nodes` (width decoder.in_dim, or
    the first row's) decide broadcast or joins. Fewer rows than pairs: the staged files are
    discarded and PairsError (one line, from pairs.refuse_bad_pairs against `vertices`) names the
    null or unknown ids; `what` names the pairs in it."""
    from sparkgnn.engine.spark_compat import has_jvm
    from sparkgnn.outputs import discard, staging_path, swap_into_place

    started = time.perf_counter()
    width = decoder.in_dim or len(nodes.select("h").limit(1).collect()[0]["h"])
    shared = None
    if has_jvm(spark) and node_count * (4 * width + 8) <= BROADCAST_BYTES:
        table = NodeTable.from_arrow(nodes.select("id", "h").toArrow())
        shared = spark.sparkContext.broadcast(table)
        log.info(
            f"score_edges: {len(table.ids):,} node outputs ({table.h.nbytes / 2**20:.0f} MiB) collected and "
            f"broadcast in {time.perf_counter() - started:.1f} s; pairs scored by position, not joined"
        )
        scored = score_pairs_broadcast(shared, pairs, decoder)
    else:
        why = (
            "Spark Connect has no broadcast variables"
            if not has_jvm(spark)
            else (f"{node_count:,} node outputs exceed {BROADCAST_BYTES >> 20} MiB")
        )
        log.info(f"score_edges: {why}: node outputs joined onto the pairs")
        scored = score_pairs(nodes, pairs, decoder)
    staged = staging_path(out)
    try:
        scored.write.parquet(staged)
        written = spark.read.parquet(staged).count()
        if written != pair_count:
            refuse_bad_pairs(pairs, vertices, what)
            raise PairsError(f"{what}: {written:,} of {pair_count:,} pairs could be scored; nothing was written")
    except BaseException:
        discard(staged)
        raise
    finally:
        if shared is not None:
            shared.destroy()
    swap_into_place(staged, out)
    return written
