"""Scoring node pairs: node outputs joined onto the pairs in Spark, the decoder run in Arrow batches.

`score_pairs(nodes, pairs, decoder)`: `nodes` (id, h) is the batch path's result (sparkgnn.infer,
embedding output), `pairs` (src, dst[, relation]); each pair gets h of both ends by two joins, and
`mapInArrow` runs the decoder over each Arrow batch as two [B, F] matrices (payload.py rebuilds it
once per Python worker). Output (src long, dst long[, relation as given], score float).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from sparkgnn.decoders import Decoder
from sparkgnn.linkpred.arrays import ids, matrix
from sparkgnn.linkpred.pairs import RELATION
from sparkgnn.linkpred.payload import DecoderPayload

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.sql import DataFrame

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
    schema = SCORE_SCHEMA
    if RELATION in pairs.columns:
        schema = f"src long, dst long, {RELATION} {pairs.schema[RELATION].dataType.simpleString()}, score float"

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        torch.set_num_threads(1)
        built = payload.build()
        for batch in batches:
            yield score_batch(built, batch)

    return joined.mapInArrow(run, schema)
