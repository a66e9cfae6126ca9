"""Link-prediction evaluation: MRR and hits@K of held-out positive edges ranked against negatives.

Definitions are OGB's link-property-prediction evaluator's (its MRR path, which PyG's examples
also use): each positive (src, dst) is ranked among its own negatives (src, n) by score, with
`greater` = how many negatives score above the positive (the optimistic count) and `at_least` =
how many score at least as high (the pessimistic count); its rank is
`1 + (greater + at_least) / 2`, so a tie counts half. MRR = mean(1 / rank), hits@K = mean(rank <= K).
Scores are the decoder's outputs (after its `final`, as a PyG model hands them to OGB's evaluator).

Negatives, two modes:
- sampled (`sampled_counts`): `num_negatives` candidates per positive, drawn uniformly with
  replacement from the candidates by a hash of (seed, src, dst, j), so a seed gives the same
  negatives on every run and partitioning; unfiltered (a draw may be a known edge), as OGB's sampled
  negatives are.
- full (`full_counts`): every candidate except the positive's own dst (and, with `exclude`, except
  the source's known neighbours: the filtered ranking). When the candidates' outputs fit in
  scoring.BROADCAST_BYTES (and the session has broadcast variables) they are broadcast as the
  exact top-k's are (topk.share_outputs); the positives are grouped by source into rows (the
  source's output, its positives' dsts and outputs, its excluded dsts) and each task walks every
  candidate in bounded tiles for a few hundred sources at a time (`broadcast_counts`,
  `table_counts`), so each positive is counted whole in one task. WHY not the blocks below at
  that size: their cross join ships every candidate tile, one Spark row each, once per source
  block through the JVM's row sorter, which ran the exact top-k out of driver heap at 800K 128-d
  candidates. Otherwise (outputs over the budget, or Spark Connect) source blocks x candidate
  tiles as the exact top-k's fallback: each tile contributes its counts and a shuffle sums them
  per positive.
In both the positive is scored in the same decoder call as its negatives, so equal embeddings give
equal scores (a tie) rather than two roundings of one product.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from sparkgnn import npsets
from sparkgnn.decoders import Decoder
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.payload import DecoderPayload
from sparkgnn.linkpred.scoring import BROADCAST_BYTES
from sparkgnn.linkpred.tiles import TILE_SCORES, pair_scores

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

HITS_AT = (1, 10, 50)
COUNTS_SCHEMA = "src long, dst long, greater long, at_least long"
POSITIVE_CHUNK = 1024  # positives whose [chunk, tile] score rows are compared at once


def ogb_rank(greater: np.ndarray, at_least: np.ndarray) -> np.ndarray:
    """OGB's rank of each positive (module doc): 1 + (optimistic + pessimistic) / 2."""
    return 1.0 + 0.5 * (np.asarray(greater, np.float64) + np.asarray(at_least, np.float64))


def rank_metrics(ranks: np.ndarray, hits_at: Sequence[int] = HITS_AT) -> dict[str, float]:
    """{"mrr", "hits@K"...} of the positives' ranks (module doc); ValueError when there are none."""
    ranks = np.asarray(ranks, np.float64)
    if not len(ranks):
        raise ValueError("no held-out positives to evaluate")
    out = {"mrr": float(np.mean(1.0 / ranks))}
    out.update({f"hits@{k}": float(np.mean(ranks <= k)) for k in hits_at})
    return out


def beating(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(greater, at_least) per row: negatives in neg[i] above / at least pos[i]; -inf never counts."""
    pos = np.asarray(pos)[:, None]
    return (neg > pos).sum(axis=1).astype(np.int64), (neg >= pos).sum(axis=1).astype(np.int64)


def sampled_batch(
    decoder: Decoder, h_src: np.ndarray, h_dst: np.ndarray, h_neg: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(greater, at_least) of B positives: h_src, h_dst [B, F], h_neg [B, n, F] their negatives'
    outputs; the positive and its negatives are scored in one decoder call."""
    b, n = h_neg.shape[0], h_neg.shape[1]
    if b == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    right = np.concatenate([h_dst[:, None, :], h_neg], axis=1).reshape(b * (n + 1), -1)
    left = np.repeat(h_src, n + 1, axis=0)
    scores = decoder(torch.from_numpy(left), torch.from_numpy(np.ascontiguousarray(right))).numpy()
    scores = scores.reshape(b, n + 1)
    return beating(scores[:, 0], scores[:, 1:])


def tile_counts(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    pos_src: np.ndarray,
    pos_dst: np.ndarray,
    pos_h: np.ndarray,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(greater, at_least) of each positive (pos_src[i], pos_dst[i], h of pos_dst pos_h[i]) against
    this tile's candidates, leaving out the positive's own dst and, with `exclude`, the (src, dst)
    pairs given (known edges). Every pos_src must be in `src_ids` (the block's sources)."""
    order = np.argsort(cand_ids, kind="stable")
    return sorted_tile_counts(
        decoder, src_ids, sources, np.asarray(cand_ids, np.int64)[order], candidates[order],
        pos_src, pos_dst, pos_h, exclude,
    )  # fmt: skip


def sorted_tile_counts(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    pos_src: np.ndarray,
    pos_dst: np.ndarray,
    pos_h: np.ndarray,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """tile_counts of candidates whose `cand_ids` are already ascending (no reordering copy)."""
    cand_ids = np.asarray(cand_ids, np.int64)
    pos_src, pos_dst = np.asarray(pos_src, np.int64), np.asarray(pos_dst, np.int64)
    n_pos = len(pos_src)
    greater, at_least = np.zeros(n_pos, np.int64), np.zeros(n_pos, np.int64)
    if not n_pos or not len(cand_ids):
        return greater, at_least
    src_ids = np.asarray(src_ids, np.int64)
    by_id = np.argsort(src_ids, kind="stable")
    at = np.minimum(np.searchsorted(src_ids[by_id], pos_src), len(src_ids) - 1)
    if not np.array_equal(src_ids[by_id][at], pos_src):
        raise ValueError("every positive's source must be among the block's sources")
    row_of = by_id[at]
    # left out per positive: its own dst, and its source's excluded pairs that fall in this tile
    col = np.minimum(np.searchsorted(cand_ids, pos_dst), len(cand_ids) - 1)
    own = cand_ids[col] == pos_dst
    skip_p, skip_c = [np.flatnonzero(own)], [col[own]]
    if exclude is not None and len(exclude[0]):
        by_src = np.argsort(pos_src, kind="stable")
        sorted_src = pos_src[by_src]
        ex_src, ex_dst = np.asarray(exclude[0], np.int64), np.asarray(exclude[1], np.int64)
        col = np.minimum(np.searchsorted(cand_ids, ex_dst), len(cand_ids) - 1)
        in_tile = cand_ids[col] == ex_dst
        ex_src, col = ex_src[in_tile], col[in_tile]
        lo, hi = np.searchsorted(sorted_src, ex_src, "left"), np.searchsorted(sorted_src, ex_src, "right")
        count = hi - lo
        starts = np.repeat(lo - np.cumsum(np.r_[0, count[:-1]]), count)
        skip_p.append(by_src[np.arange(count.sum()) + starts])
        skip_c.append(np.repeat(col, count))
    skip = npsets.unique(np.concatenate(skip_p) * len(cand_ids) + np.concatenate(skip_c))
    skip_p_all, skip_c_all = skip // len(cand_ids), skip % len(cand_ids)
    for start in range(0, n_pos, POSITIVE_CHUNK):
        chunk = slice(start, min(n_pos, start + POSITIVE_CHUNK))
        rows_c = row_of[chunk]
        uniq, inverse = np.unique(rows_c, return_inverse=True)
        right = np.concatenate([pos_h[chunk], candidates], axis=0)
        raw = pair_scores(decoder, sources[uniq], right)
        scores = decoder.apply_final(torch.from_numpy(np.ascontiguousarray(raw))).numpy()
        width = chunk.stop - chunk.start
        pos = scores[inverse, np.arange(width)]
        neg = scores[inverse, width:]
        mine = (skip_p_all >= chunk.start) & (skip_p_all < chunk.stop)
        neg[skip_p_all[mine] - chunk.start, skip_c_all[mine]] = -np.inf
        g, a = beating(pos, neg)
        greater[chunk], at_least[chunk] = g, a
    return greater, at_least


def table_counts(
    decoder: Decoder,
    src_ids: np.ndarray,
    sources: np.ndarray,
    cand_ids: np.ndarray,
    candidates: np.ndarray,
    pos_src: np.ndarray,
    pos_dst: np.ndarray,
    pos_h: np.ndarray,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    tile_scores: int = TILE_SCORES,
) -> tuple[np.ndarray, np.ndarray]:
    """(greater, at_least) of each positive against ALL `candidates` (`cand_ids` ascending), whole:
    the candidates are walked in tiles of about `tile_scores` / min(positives, POSITIVE_CHUNK)
    rows and each tile's counts (sorted_tile_counts: same exclusions, the positive scored in the
    tile's own decoder call) added up here, so memory stays bounded by `tile_scores` whatever the
    number of candidates and no partial count leaves the caller."""
    if tile_scores < 1:
        raise ValueError(f"tile_scores must be >= 1, got {tile_scores!r}")
    n_pos = len(pos_src)
    greater, at_least = np.zeros(n_pos, np.int64), np.zeros(n_pos, np.int64)
    rows = max(1, tile_scores // max(1, min(n_pos, POSITIVE_CHUNK)))
    for lo in range(0, len(cand_ids) if n_pos else 0, rows):
        g, a = sorted_tile_counts(
            decoder, src_ids, sources, cand_ids[lo : lo + rows], candidates[lo : lo + rows],
            pos_src, pos_dst, pos_h, exclude,
        )  # fmt: skip
        greater += g
        at_least += a
    return greater, at_least


def sample_negatives(positives: DataFrame, candidates: DataFrame, num_negatives: int, seed: int) -> DataFrame:
    """(src, dst, neg): `num_negatives` candidate ids per positive (module doc: seeded, uniform,
    with replacement). `candidates`: an `id` frame, numbered 0..C-1 in id order by one window over
    the ids alone (Spark runs it in one partition: 8 bytes a candidate)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    indexed = candidates.select("id").withColumn("idx", F.row_number().over(Window.orderBy("id")) - F.lit(1))
    count = indexed.count()
    if not count:
        raise ValueError("there are no candidates to draw negatives from")
    drawn = positives.select("src", "dst", F.explode(F.sequence(F.lit(0), F.lit(num_negatives - 1))).alias("j"))
    drawn = drawn.withColumn("idx", F.pmod(F.xxhash64(F.lit(seed), "src", "dst", "j"), F.lit(count)))
    return drawn.join(indexed, on="idx").select("src", "dst", F.col("id").alias("neg"))


def sampled_counts(
    nodes: DataFrame, positives: DataFrame, decoder: Decoder, candidates: DataFrame, num_negatives: int, seed: int
) -> DataFrame:
    """(src, dst, greater, at_least) of each distinct positive against its sampled negatives."""
    from pyspark.sql import functions as F

    payload = DecoderPayload.of(decoder)
    positives = positives.select("src", "dst").distinct()
    negs = (
        sample_negatives(positives, candidates, num_negatives, seed)
        .join(nodes.select(F.col("id").alias("neg"), F.col("h").alias("h_neg")), on="neg")
        .groupBy("src", "dst")
        .agg(F.collect_list("h_neg").alias("h_negs"))
    )
    rows = (
        negs.join(nodes.select(F.col("id").alias("src"), F.col("h").alias("h_src")), on="src")
        .join(nodes.select(F.col("id").alias("dst"), F.col("h").alias("h_dst")), on="dst")
        .select("src", "dst", "h_src", "h_dst", "h_negs")
    )

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            h_src, h_dst = matrix(batch.column("h_src")), matrix(batch.column("h_dst"))
            h_neg = matrix(batch.column("h_negs").flatten()).reshape(len(batch), num_negatives, -1)
            greater, at_least = sampled_batch(built, h_src, h_dst, h_neg)
            yield pa.RecordBatch.from_arrays(
                [pa.array(ids(batch.column("src"))), pa.array(ids(batch.column("dst"))), greater, at_least],
                names=["src", "dst", "greater", "at_least"],
            )

    return rows.mapInArrow(run, COUNTS_SCHEMA)


def full_counts(
    nodes: DataFrame,
    positives: DataFrame,
    decoder: Decoder,
    *,
    candidates: DataFrame | None = None,
    exclude: DataFrame | None = None,
    partitions: int = 2,
    broadcast_bytes: int = BROADCAST_BYTES,
) -> DataFrame:
    """(src, dst, greater, at_least) of each distinct positive against every candidate (module doc).
    `candidates`: an `id` frame (None: every node); `exclude`: (src, dst) pairs never negatives;
    `partitions`: the fewest tasks. Candidates of at most `broadcast_bytes` are broadcast and each
    positive counted whole in one task (broadcast_counts); otherwise source blocks x candidate
    tiles whose partial counts are summed per positive."""
    from pyspark.sql import functions as F

    from sparkgnn.linkpred.topk import (
        block_count,
        blocks,
        blocks_for,
        cross_units,
        exclusions,
        output_shape,
        outputs_bytes,
        share_outputs,
    )

    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    payload = DecoderPayload.of(decoder)
    positives = positives.select("src", "dst").distinct()
    cand_nodes = nodes if candidates is None else nodes.join(candidates.select("id"), on="id")
    src_nodes = nodes.join(positives.select(F.col("src").alias("id")).distinct(), on="id")
    c_shape = output_shape(cand_nodes)
    shared = share_outputs(cand_nodes, c_shape, broadcast_bytes=broadcast_bytes)
    if shared is not None:
        return broadcast_counts(shared, positive_rows(nodes, src_nodes, positives, exclude, partitions), payload)
    log.info(
        f"eval: {c_shape[0]:,} candidate outputs ({outputs_bytes(c_shape) >> 20} MiB) exceed the broadcast budget "
        f"({broadcast_bytes >> 20} MiB) or the session has no broadcast: source blocks x candidate tiles"
    )
    s_count = block_count(src_nodes, partitions)  # bounded rows, as topk_frame's (topk.py)
    c_count = blocks_for(c_shape, partitions)
    pos = (
        positives.join(nodes.select(F.col("id").alias("dst"), F.col("h").alias("h_dst")), on="dst")
        .withColumn("s_block", F.pmod(F.xxhash64("src"), F.lit(s_count)).cast("int"))
        .groupBy("s_block")
        .agg(
            F.collect_list("src").alias("p_src"),
            F.collect_list("dst").alias("p_dst"),
            F.collect_list("h_dst").alias("p_h"),
        )
    )
    s_blocks = blocks(src_nodes, s_count, "s_").join(pos, on="s_block")
    excluding = exclude is not None
    if exclude is not None:
        s_blocks = s_blocks.join(exclusions(exclude, src_nodes, s_count), on="s_block", how="left")
    units = cross_units(s_blocks, blocks(cand_nodes, c_count, "c_")).repartition(max(partitions**2, s_count * c_count))

    def count_units(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            for i in range(len(batch)):
                p_src, p_dst = ids(batch.column("p_src")[i].values), ids(batch.column("p_dst")[i].values)
                excl = None
                if excluding and batch.column("ex_src")[i].is_valid:
                    excl = (ids(batch.column("ex_src")[i].values), ids(batch.column("ex_dst")[i].values))
                greater, at_least = tile_counts(
                    built,
                    ids(batch.column("s_ids")[i].values),
                    matrix(batch.column("s_hs")[i].values),
                    ids(batch.column("c_ids")[i].values),
                    matrix(batch.column("c_hs")[i].values),
                    p_src,
                    p_dst,
                    matrix(batch.column("p_h")[i].values),
                    excl,
                )
                yield pa.RecordBatch.from_arrays(
                    [pa.array(p_src), pa.array(p_dst), greater, at_least], names=["src", "dst", "greater", "at_least"]
                )

    partial = units.mapInArrow(count_units, COUNTS_SCHEMA)
    return partial.groupBy("src", "dst").agg(
        F.sum("greater").cast("long").alias("greater"), F.sum("at_least").cast("long").alias("at_least")
    )


def positive_rows(
    nodes: DataFrame, src_nodes: DataFrame, positives: DataFrame, exclude: DataFrame | None, partitions: int
) -> DataFrame:
    """(id, h[, ex_dst], p_dst, p_h): one row per source of `positives` (src, dst, distinct) with
    its output, its positives' dsts and their outputs (a positive whose src or dst has no output is
    left out: the jobs refuse unknown ids first) and, with `exclude`, its excluded dsts (source_rows), in
    at least `partitions` partitions (hash by id where the join gives fewer)."""
    from pyspark.sql import functions as F

    from sparkgnn.linkpred.topk import source_rows

    grouped = (
        positives.join(nodes.select(F.col("id").alias("dst"), F.col("h").alias("h_dst")), on="dst")
        .groupBy(F.col("src").alias("id"))
        .agg(F.collect_list("dst").alias("p_dst"), F.collect_list("h_dst").alias("p_h"))
    )
    rows = source_rows(src_nodes, exclude, 1).join(grouped, on="id")
    if rows.rdd.getNumPartitions() < partitions:
        rows = rows.repartition(partitions, "id")
    return rows


def broadcast_counts(shared: Broadcast, rows: DataFrame, payload: DecoderPayload) -> DataFrame:
    """COUNTS_SCHEMA of every positive in `rows` (positive_rows) against every candidate of the
    broadcast NodeTable `shared`: each task takes SOURCE_ROWS sources of an Arrow batch at a time
    (topk.map_source_slices) and counts their positives whole (table_counts: candidate tiles,
    POSITIVE_CHUNK positives at once), so no partial count is shuffled and summed."""
    from sparkgnn.linkpred.topk import batch_exclusions, map_source_slices

    def answer(built, table, part: pa.RecordBatch) -> pa.RecordBatch:
        src_ids, lists = ids(part.column("id")), part.column("p_dst")
        pos_src = np.repeat(src_ids, lists.value_lengths().to_numpy(zero_copy_only=False))
        pos_dst = ids(lists.flatten())
        greater, at_least = table_counts(
            built, src_ids, matrix(part.column("h")), table.ids, table.h,
            pos_src, pos_dst, matrix(part.column("p_h").flatten()), batch_exclusions(part),
        )  # fmt: skip
        return pa.RecordBatch.from_arrays(
            [pa.array(pos_src), pa.array(pos_dst), greater, at_least], names=["src", "dst", "greater", "at_least"]
        )

    return map_source_slices(shared, rows, payload, COUNTS_SCHEMA, answer)


def metrics_of(counts: DataFrame, hits_at: Sequence[int] = HITS_AT) -> dict[str, float]:
    """rank_metrics of the (greater, at_least) counts, aggregated in Spark; plus "positives"."""
    from pyspark.sql import functions as F

    rank = F.lit(1.0) + F.lit(0.5) * (F.col("greater") + F.col("at_least"))
    aggs = [F.count(F.lit(1)).alias("positives"), F.avg(F.lit(1.0) / rank).alias("mrr")]
    aggs += [F.avg((rank <= F.lit(k)).cast("double")).alias(f"hits@{k}") for k in hits_at]
    row = counts.agg(*aggs).collect()[0]
    if not row["positives"]:
        raise ValueError("no held-out positives to evaluate")
    return {
        "positives": int(row["positives"]),
        **{name: float(row[name]) for name in ["mrr"] + [f"hits@{k}" for k in hits_at]},
    }
