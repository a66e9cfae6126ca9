"""Row-wise work of a typed round (engine.typed): node ops per type, the constant input rows of a
type without features, and the merge of a round's relation outputs per destination type.

WHY one merge pass per round: a round's relations into a type each give a row per destination id,
which the round's cross-relation aggregation folds (sum, mean over the relations, max, min) before
the type's post ops run. Folding in Spark SQL (union, `collect_list` per id, a `zip_with` lambda
per element) costs a shuffle and an interpreted fold per type, and the post ops then need another
Python pass; here every relation output of the round, of every destination type, is tagged with
its type, shuffled ONCE by (type, id), sorted within each partition, and one Python pass per
partition folds each id's rows with numpy (Arrow batches, the vectors read as one float32 matrix
per type without per-row Python work) and applies the type's post ops (torch) to the folded rows,
streaming: batches arrive in (type, id) order, so only the last id of a batch is carried to
the next and a partition is never held whole. HGT's `softmax` across relations folds the same
way: each relation's row is a partial softmax state, folded per id by the round's
RelationAggregator (rescaled to the id's largest max, added, divided). The round's values of all
types are written in one Parquet write, partitioned by type, and read back per type, so a round's
lineage stays short.

WHY a type without features gets a driver-computed constant: its input row is the same constant
column of ones for every node (what PyG users feed such a type), and the type's input ops are
row-wise, so every node's input value is the ops applied to that one row: computed once on the
driver, it becomes a literal column and no Python worker reads the type's rows at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkgnn.layers.hetero import RelationAggregator
from sparkgnn.layers.nodeops import NodeOpStack

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: The cross-relation aggregations the merge folds (HeteroRound's relation_aggr names).
AGGREGATIONS = ("sum", "mean", "max", "min")
# The column that tags a merge row with its destination type's index in the round.
_TYPE_COLUMN = "t"


def apply_node_ops(frame: DataFrame, stack: NodeOpStack) -> DataFrame:
    """(id, h) with `stack` applied to every row's h (row-wise node ops, as the model's), lazily:
    the ops run in the tasks of whichever Spark job reads the frame (engine.typed: a type's input
    ops in the relation jobs' tasks that read its features), batch by batch (node_ops_batches)."""
    if len(stack) == 0:
        return frame.select("id", "h")
    return frame.select("id", "h").mapInArrow(node_ops_batches(stack), "id long, h array<float>")


def node_ops_batches(stack: NodeOpStack):
    """The mapInArrow function of apply_node_ops: (id, h) record batches in, the same ids with
    `stack` applied to h out, each batch's vectors read as one float32 matrix (no per-row Python)."""

    def run(batches):
        import numpy as np
        import pyarrow as pa
        import torch

        from sparkgnn.arrowvec import to_list, to_numpy_matrix

        for batch in batches:
            if batch.num_rows == 0:
                continue
            x = to_numpy_matrix(batch.column(batch.schema.get_field_index("h")))
            with torch.no_grad():  # a read-only Arrow view is copied: torch tensors are writable
                y = stack(torch.from_numpy(x if x.flags.writeable else x.copy())).numpy()
            ids = batch.column(batch.schema.get_field_index("id"))
            yield pa.RecordBatch.from_arrays([ids, to_list(y.astype(np.float32, copy=False))], names=["id", "h"])

    return run


def constant_rows(frame: DataFrame, width: int, stack: NodeOpStack | None) -> DataFrame:
    """(id, h): every id of `frame` with the constant input of a type without features, a column
    of `width` ones through the type's input ops `stack` (module doc: computed once, here)."""
    from pyspark.sql import functions as F

    if stack is None or len(stack) == 0:
        return frame.selectExpr("id", f"array_repeat(CAST(1.0 AS FLOAT), {width}) AS h")
    import torch

    with torch.no_grad():
        row = stack(torch.ones(1, width, dtype=torch.float32))[0].tolist()
    # a double literal holds each float32 value exactly, so the cast gives the value back bit for bit
    return frame.select("id", F.array(*[F.lit(float(v)).cast("float") for v in row]).alias("h"))


def merge_round(
    spark: SparkSession,
    by_type: Mapping[str, list[DataFrame]],
    aggr: str | RelationAggregator,
    post: Mapping[str, NodeOpStack],
    path: str,
    *,
    partitions: int,
) -> dict[str, DataFrame]:
    """Each destination type's (id, h): its relation outputs (`by_type[T]`, (id, h) frames each)
    folded per id with `aggr` (a name of AGGREGATIONS or the round's RelationAggregator; mean: the
    sum over the rows an id has, divided by their count, each relation giving every row) and then
    `post[T]` applied, all types in one shuffle and one Python pass, written under `path` (one
    Parquet folder per type) and read back (module doc)."""
    from pyspark.sql import functions as F

    _check_aggr(aggr)
    if partitions < 1:
        raise ValueError(f"the merge needs at least one partition, got {partitions}")
    types = sorted(by_type)
    tagged = [
        frame.select(F.lit(index).cast("int").alias(_TYPE_COLUMN), "id", "h")
        for index, t in enumerate(types)
        for frame in by_type[t]
    ]
    if not tagged:
        return {}
    union = tagged[0]
    for other in tagged[1:]:
        union = union.unionByName(other)
    stacks = {index: post[t] for index, t in enumerate(types) if t in post and len(post[t])}
    folded = (
        union.repartition(partitions, _TYPE_COLUMN, "id")
        .sortWithinPartitions(_TYPE_COLUMN, "id")
        .mapInArrow(_folder(aggr, stacks), f"{_TYPE_COLUMN} int, id long, h array<float>")
    )
    folded.write.partitionBy(_TYPE_COLUMN).parquet(path)
    return {t: _read_type(spark, path, index) for index, t in enumerate(types)}


def _check_aggr(aggr: str | RelationAggregator) -> None:
    if isinstance(aggr, RelationAggregator):
        return
    if aggr not in AGGREGATIONS:
        raise ValueError(
            f"unknown cross-relation aggregation {aggr!r}; known: {', '.join(AGGREGATIONS)} "
            "(softmax: pass the round's RelationAggregator, which knows its heads)"
        )


def _read_type(spark, path: str, index: int) -> DataFrame:
    """Type `index`'s rows of a merge's output (no folder: the type had no rows)."""
    from sparkgnn import files

    folder = files.join(path, f"{_TYPE_COLUMN}={index}")
    if not files.exists(folder):
        return spark.createDataFrame([], "id long, h array<float>")
    return spark.read.schema("id long, h array<float>").parquet(folder)


def _folder(aggr: str | RelationAggregator, stacks: Mapping[int, NodeOpStack]):
    """The mapInArrow function of merge_round: record batches sorted by (t, id) in, folded rows
    out (module doc: only the last key of a batch is carried to the next)."""
    _check_aggr(aggr)

    def run(batches):
        import numpy as np
        import pyarrow as pa

        carry = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if carry is not None:
                batch = pa.Table.from_batches([carry, batch]).combine_chunks().to_batches()[0]
            t, ids = _column(batch, _TYPE_COLUMN), _column(batch, "id")
            cut = int(np.argmax((t == t[-1]) & (ids == ids[-1])))  # the last key may go on in the next batch
            carry = batch.slice(cut)
            if cut:
                yield from _fold_rows(batch.slice(0, cut), aggr, stacks)
        if carry is not None and carry.num_rows:
            yield from _fold_rows(carry, aggr, stacks)

    return run


def _column(batch, name: str):
    import numpy as np

    return np.asarray(batch.column(batch.schema.get_field_index(name)))


def _fold_rows(batch, aggr: str | RelationAggregator, stacks: Mapping[int, NodeOpStack]):
    """A record batch sorted by (t, id), every key whole: one folded row per key, with its type's
    post ops, one output batch per type (a type's rows are contiguous; widths differ by type)."""
    import numpy as np
    import pyarrow as pa
    import torch

    from sparkgnn.arrowvec import to_list, to_numpy_matrix

    if isinstance(aggr, RelationAggregator) and aggr.name != "softmax":
        aggr = aggr.name  # folded by numpy below
    t, ids = _column(batch, _TYPE_COLUMN), _column(batch, "id")
    vectors = batch.column(batch.schema.get_field_index("h"))
    bounds = np.flatnonzero(np.r_[True, t[1:] != t[:-1], True])
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        h = to_numpy_matrix(vectors.slice(a, b - a))
        keys = ids[a:b]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        if isinstance(aggr, RelationAggregator):
            group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(keys)]))
            with torch.no_grad():
                rows = torch.from_numpy(h if h.flags.writeable else h.copy())  # torch tensors are writable
                folded = aggr.fold(rows, torch.from_numpy(group), len(starts))
            out = folded.numpy().astype(np.float32, copy=False)
        elif aggr in ("sum", "mean"):
            out = np.add.reduceat(h, starts, axis=0)
            if aggr == "mean":
                counts = np.diff(np.r_[starts, len(keys)])
                out = (out / counts[:, None]).astype(np.float32)
        elif aggr == "max":
            out = np.maximum.reduceat(h, starts, axis=0)
        else:
            out = np.minimum.reduceat(h, starts, axis=0)
        stack = stacks.get(int(t[a]))
        if stack is not None:
            with torch.no_grad():
                out = stack(torch.from_numpy(np.ascontiguousarray(out))).numpy().astype(np.float32)
        columns = [pa.array(np.full(len(starts), t[a], dtype=np.int32)), pa.array(keys[starts]), to_list(out)]
        yield pa.RecordBatch.from_arrays(columns, names=[_TYPE_COLUMN, "id", "h"])


__all__ = ["AGGREGATIONS", "apply_node_ops", "constant_rows", "merge_round", "node_ops_batches"]
