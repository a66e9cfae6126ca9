"""Approximate top-k for inner-product decoders (dot, cosine): an HNSW vector index per candidate shard.

The raw score of an inner-product decoder is <v(src), v(dst)> of its search vectors (the outputs
for dot, the unit-normalised outputs for cosine), so each source's k best candidates are a maximum
inner-product search. With IndexParams.when "auto" (the default) the index is built only where it
costs less than exact scoring (`index_pays`: its build is paid whatever the number of sources, so a
few thousand sources are answered exactly, by topk.topk_frame, sooner than the index is built).

When the candidates' outputs fit in scoring.BROADCAST_BYTES (`broadcast_approx`), they are
broadcast as a NodeTable and cut into `partitions` contiguous shards; every source row (its output
and exclusions) is paired with every shard number and range-partitioned by shard, so task j builds
shard j's index once (faiss `IndexHNSWFlat`, inner-product metric, one thread) from the broadcast
and answers every source against it; no Spark row ever holds a shard. Otherwise candidates are
hashed into shards (topk.blocks, sized as the exact path sizes its tiles) and the cross join of
source blocks and shards is range-partitioned by shard and sorted, so a task builds each of its
shards' index once and answers every source block against it. Each answer is re-scored exactly
from the search vectors, known edges are masked (a source is asked for k plus the candidates it
excludes in that shard, shard_topk), and each source keeps its k best of the shard; the partial
lists of all shards merge as the exact ones do (topk.merge_partial), so the output has the exact
job's schema and order (a higher score first, the smaller id among equals).

WHY faiss HNSW searching inner products directly: in a measurement (the comment at ShardIndex)
faiss-cpu and usearch reached about the same recall@10, faiss with the smaller dependency set
(numpy only), while the MIPS-to-L2 reduction (one extra coordinate) lost much of the recall on
unclustered vectors.

`recall_at_k` compares an approximate answer with the exact one on a seeded sample of sources
(`sample_sources`), which the job reports.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from sparkgnn import npsets
from sparkgnn.decoders import Decoder
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.payload import DecoderPayload
from sparkgnn.linkpred.scoring import BROADCAST_BYTES
from sparkgnn.linkpred.tiles import locate_pairs, merge_topk
from sparkgnn.linkpred.topk import (
    BLOCK_BYTES,
    PARTIAL_SCHEMA,
    batch_exclusions,
    block_count,
    blocks,
    blocks_for,
    broadcast_topk,
    check_k,
    cross_units,
    exclusions,
    merge_partial,
    output_shape,
    restricted,
    share_outputs,
    source_rows,
    topk_frame,
)

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


SEARCH_ROWS = 1 << 18  # answers (sources x asked) one index search gathers and re-scores at most


@dataclass(frozen=True)
class IndexParams:
    """HNSW settings: `m` links per node, `ef_construction` / `ef_search` the candidate lists kept
    while building / searching (a search always keeps at least as many as it returns)."""

    m: int = 32
    ef_construction: int = 80
    ef_search: int = 128
    when: str = "auto"  # "auto": build the index only where it is cheaper than exact scoring (index_pays); "always"

    def __post_init__(self):
        for name in ("m", "ef_construction", "ef_search"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"index {name} must be an integer >= 1, got {value!r}")
        if self.when not in ("auto", "always"):
            raise ValueError(f"index when must be 'auto' or 'always', got {self.when!r}")


# Cost of the index in exact dot products (one source x one candidate), for index_pays: inserting
# one vector at m=32, ef_construction=80 and answering one query at ef_search=128 on one shard,
# each scaled linearly by the parameters. Measured with faiss HNSW on the 128-d bench-linkpred
# embeddings against a torch matrix product; only their ratio to the matrix product matters.
INSERT_DOTS = 40_000
QUERY_DOTS = 60_000


def index_pays(sources: int, candidates: int, shards: int, params: IndexParams = IndexParams()) -> bool:
    """Whether building `shards` HNSW shards over `candidates` and asking each of them for every one
    of `sources` costs less than scoring every (source, candidate) pair exactly. WHY ask: the build
    is paid whatever the number of sources, so for a few thousand sources the exact top-k finishes
    before the index is built; the approximate job then answers exactly."""
    insert = INSERT_DOTS * params.m * params.ef_construction / (32 * 80)
    query = QUERY_DOTS * params.ef_search / 128
    return candidates * insert + sources * shards * query < sources * candidates


def check_approx_decoder(decoder: Decoder) -> None:
    """Refuse (ValueError, one line) a decoder a vector index cannot search: not an inner product."""
    if not decoder.inner_product:
        raise ValueError(
            f"--approx needs a dot or cosine decoder (an inner product a vector index searches); "
            f"the model's decoder is {decoder.kind}: run the exact top-k without --approx"
        )


def search_vectors(decoder: Decoder, h: np.ndarray) -> np.ndarray:
    """[N, F] float32 C-contiguous search vectors of node outputs `h` (decoders/base.py)."""
    with torch.no_grad():
        out = decoder.search_vectors(torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32)))
    return np.ascontiguousarray(out.numpy(), dtype=np.float32)


# Library pick, measured single-threaded on 50K x 64 float32 vectors, 2,000 queries, k=10, on a
# loaded 2-core machine (times inflated; compare within a row):
#   data / decoder       faiss-cpu 1.15.1 HNSW-IP       usearch 2.26.6 ip          faiss HNSW-L2 (MIPS->L2)
#                        build / query / recall@10      build / query / recall@10  build / query / recall@10
#   Gaussian, dot        24.3 s / 1.71 s / 0.971        19.4 s / 2.13 s / 0.966    19.0 s / 0.79 s / 0.597
#   clustered, dot        6.3 s / 0.25 s / 0.982         8.0 s / 0.30 s / 0.986     5.1 s / 0.30 s / 0.992
#   clustered, cosine     7.8 s / 0.36 s / 1.000         4.0 s / 0.24 s / 1.000     5.2 s / 0.18 s / 1.000
# (faiss M=32, efConstruction=80, efSearch=128; usearch connectivity 32, expansion 80 / 128;
# numpy brute force of the same queries: about 20 s.)
class ShardIndex:
    """An HNSW inner-product index over one shard's search vectors; labels are row positions."""

    def __init__(self, vectors: np.ndarray, params: IndexParams = IndexParams()):
        import faiss

        faiss.omp_set_num_threads(1)
        self.params = params
        self.size = len(vectors)
        self.index = faiss.IndexHNSWFlat(int(vectors.shape[1]), params.m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = params.ef_construction
        if self.size:
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def search(self, queries: np.ndarray, count: int) -> np.ndarray:
        """[Q, count] row positions of each query's approximate `count` best (-1 pads a short list)."""
        count = min(int(count), self.size)
        if not count or not len(queries):
            return np.full((len(queries), max(count, 0)), -1, np.int64)
        self.index.hnsw.efSearch = max(self.params.ef_search, count)
        _, labels = self.index.search(np.ascontiguousarray(queries, dtype=np.float32), count)
        return labels.astype(np.int64, copy=False)


def shard_topk(
    index: ShardIndex,
    cand_ids: np.ndarray,
    cand_vectors: np.ndarray,
    src_ids: np.ndarray,
    src_vectors: np.ndarray,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, raw score) of each source's k best in the shard as the index finds them, re-scored
    exactly; `cand_ids` ascending and `cand_vectors` (the indexed search vectors) in that order;
    `exclude`: (src, dst) pairs never returned. WHY sources are asked in groups: a source with E
    excluded candidates in the shard must ask for k + E; the sources are grouped by E rounded up to
    a power of two, so one hub with thousands of known edges does not make every source of the
    batch ask (and re-score) thousands."""
    src_ids = np.asarray(src_ids, np.int64)
    n_src, n_cand = len(src_ids), len(cand_ids)
    excluded = np.zeros(0, np.int64)
    extra = np.zeros(n_src, np.int64)
    if exclude is not None and len(exclude[0]) and n_cand and n_src:
        rows, cols = locate_pairs(src_ids, cand_ids, exclude[0], exclude[1])
        excluded = npsets.unique(rows * n_cand + cols)
        per_source = np.bincount(excluded // n_cand, minlength=n_src)
        extra = np.where(per_source > 0, 1 << np.ceil(np.log2(np.maximum(per_source, 1))).astype(np.int64), 0)
    parts = [(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))]
    for more in npsets.unique(extra).tolist():
        group = np.flatnonzero(extra == more)
        step = max(1, SEARCH_ROWS // (k + more))
        for at in range(0, len(group), step):
            chosen = group[at : at + step]
            labels = index.search(src_vectors[chosen], k + more)
            valid = labels >= 0
            safe = np.where(valid, labels, 0)
            raw = np.einsum("sf,scf->sc", src_vectors[chosen], cand_vectors[safe]).astype(np.float32, copy=False)
            if more:
                valid &= ~np.isin(chosen[:, None] * n_cand + safe, excluded)
            src = np.broadcast_to(src_ids[chosen][:, None], labels.shape)[valid]
            parts.append((src, np.asarray(cand_ids, np.int64)[safe[valid]], raw[valid]))
    src, dst, score = (np.concatenate(column) for column in zip(*parts, strict=True))
    src, dst, score, _rank = merge_topk(src, dst, score, k)
    return src, dst, score


def approx_topk_frame(
    nodes: DataFrame,
    decoder: Decoder,
    k: int,
    *,
    sources: DataFrame | None = None,
    candidates: DataFrame | None = None,
    exclude: DataFrame | None = None,
    partitions: int = 2,
    params: IndexParams = IndexParams(),
    block_bytes: int = BLOCK_BYTES,
    broadcast_bytes: int = BROADCAST_BYTES,
) -> DataFrame:
    """Approximate top-k (module doc), with topk_frame's arguments and output; `partitions`: the
    fewest source blocks and candidate shards each (one index per shard; more where one would
    exceed `block_bytes`), the tasks that answer the shards and the merge's partitions."""
    k = check_k(k)
    check_approx_decoder(decoder)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    payload = DecoderPayload.of(decoder)
    src_nodes, cand_nodes = restricted(nodes, sources), restricted(nodes, candidates)
    c_shape = output_shape(cand_nodes)
    if sources is not None:
        s_rows = sources.select("id").count()  # the ids named (the job checked them), not joined
    else:
        s_rows = c_shape[0] if candidates is None else nodes.count()
    shared = share_outputs(cand_nodes, c_shape, broadcast_bytes=broadcast_bytes)
    if params.when == "auto" and not index_pays(s_rows, c_shape[0], partitions, params):
        log.info(
            f"topk --approx: exact scoring of {s_rows:,} sources x {c_shape[0]:,} candidates costs less than "
            f"building the index; answering exactly"
        )
        if shared is not None:
            return broadcast_topk(shared, source_rows(src_nodes, exclude, partitions), payload, k)
        return topk_frame(
            nodes, decoder, k, sources=sources, candidates=candidates, exclude=exclude, partitions=partitions,
            block_bytes=block_bytes, broadcast_bytes=0,
        )  # fmt: skip
    if shared is not None:
        return broadcast_approx(shared, source_rows(src_nodes, exclude, 1), payload, k, partitions, params)
    s_count = block_count(src_nodes, partitions, block_bytes=block_bytes)
    c_count = blocks_for(c_shape, partitions, block_bytes=block_bytes)
    s_blocks = blocks(src_nodes, s_count, "s_")
    excluding = exclude is not None
    if exclude is not None:
        s_blocks = s_blocks.join(exclusions(exclude, src_nodes, s_count), on="s_block", how="left")
    units = (
        cross_units(s_blocks, blocks(cand_nodes, c_count, "c_"))
        .repartitionByRange(partitions, "c_block")
        .sortWithinPartitions("c_block", "s_block")
    )

    def answer_units(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        shard: tuple | None = None  # (c_block, index, sorted ids, sorted search vectors)
        for batch in batches:
            for i in range(len(batch)):
                c_block = batch.column("c_block")[i].as_py()
                if shard is None or shard[0] != c_block:
                    cand_ids = ids(batch.column("c_ids")[i].values)
                    order = np.argsort(cand_ids, kind="stable")
                    vectors = search_vectors(built, matrix(batch.column("c_hs")[i].values)[order])
                    shard = (c_block, ShardIndex(vectors, params), cand_ids[order], vectors)
                excl = None
                if excluding and batch.column("ex_src")[i].is_valid:
                    excl = (ids(batch.column("ex_src")[i].values), ids(batch.column("ex_dst")[i].values))
                src_vectors = search_vectors(built, matrix(batch.column("s_hs")[i].values))
                src_ids = ids(batch.column("s_ids")[i].values)
                src, dst, score = shard_topk(shard[1], shard[2], shard[3], src_ids, src_vectors, k, excl)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(src), pa.array(dst), pa.array(score, pa.float32())], names=["src", "dst", "score"]
                )

    return merge_partial(units.mapInArrow(answer_units, PARTIAL_SCHEMA), payload, k, partitions)


def broadcast_approx(
    shared: Broadcast, rows: DataFrame, payload: DecoderPayload, k: int, shards: int, params: IndexParams
) -> DataFrame:
    """PARTIAL lists merged into TOPK_SCHEMA: the broadcast NodeTable `shared` cut into `shards`
    contiguous shards, each source row of `rows` (source_rows) paired with every shard index and
    the pairs range-partitioned by shard, so task j builds shard j's index once (from the
    broadcast, never from a Spark row) and answers every source against it; the shards' partial
    lists merge as the exact ones do (topk.merge_partial). Rows that travel are one source's
    output (and exclusions) each, never a shard."""
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    shard_ids = spark.range(shards).select(F.col("id").cast("int").alias("shard"))
    units = rows.crossJoin(F.broadcast(shard_ids)).repartitionByRange(shards, "shard")

    def answer(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        table = shared.value
        bounds = np.linspace(0, len(table.ids), shards + 1).astype(np.int64)
        indexes: dict[int, tuple[ShardIndex, np.ndarray, np.ndarray]] = {}
        for batch in batches:
            shard_of = batch.column("shard").to_numpy(zero_copy_only=False)
            for shard in npsets.unique(shard_of).tolist():
                if shard not in indexes:
                    lo, hi = int(bounds[shard]), int(bounds[shard + 1])
                    vectors = search_vectors(built, table.h[lo:hi])
                    indexes[shard] = (ShardIndex(vectors, params), table.ids[lo:hi], vectors)
                part = (
                    batch
                    if len(shard_of) and shard_of[0] == shard == shard_of[-1]
                    else batch.filter(pa.array(shard_of == shard))
                )
                index, cand_ids, vectors = indexes[shard]
                src_vectors = search_vectors(built, matrix(part.column("h")))
                src, dst, score = shard_topk(
                    index, cand_ids, vectors, ids(part.column("id")), src_vectors, k, batch_exclusions(part)
                )
                yield pa.RecordBatch.from_arrays(
                    [pa.array(src), pa.array(dst), pa.array(score, pa.float32())], names=["src", "dst", "score"]
                )

    return merge_partial(units.mapInArrow(answer, PARTIAL_SCHEMA), payload, k, shards)


def sample_sources(src_ids: DataFrame, count: int, seed: int) -> DataFrame:
    """`count` ids of `src_ids` (an `id` frame) chosen by a seeded hash: one sample per seed and input."""
    from pyspark.sql import functions as F

    return (
        src_ids.select("id")
        .distinct()
        .withColumn("_order", F.xxhash64(F.lit(seed), "id"))
        .orderBy("_order", "id")
        .limit(count)
        .select("id")
    )


def recall_at_k(approx: DataFrame, exact: DataFrame) -> tuple[float, int]:
    """(mean recall, sources): per source of `exact` (src, dst), the share of its rows `approx` also
    has; sources with no exact row are left out; (nan, 0) when none is left."""
    from pyspark.sql import functions as F

    found = exact.select("src", "dst").join(approx.select("src", "dst"), on=["src", "dst"], how="left_semi")
    per = (
        exact.groupBy("src")
        .agg(F.count(F.lit(1)).alias("wanted"))
        .join(found.groupBy("src").agg(F.count(F.lit(1)).alias("got")), on="src", how="left")
        .select((F.coalesce(F.col("got"), F.lit(0)) / F.col("wanted")).alias("recall"))
    )
    row = per.agg(F.avg("recall").alias("recall"), F.count(F.lit(1)).alias("sources")).collect()[0]
    if not row["sources"]:
        return float("nan"), 0
    return float(row["recall"]), int(row["sources"])
