"""Reading and checking the node pairs a link-prediction job scores (Parquet with src, dst).

WHY refuse before any work: a pair naming an id the graph lacks has no node output, so a join
would silently drop it (or score it against nothing). The job checks every endpoint against the
graph's vertices first and refuses with one line naming how many ids are unknown and a few of
them; nothing is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkgnn.errors import SparkGNNError

if TYPE_CHECKING:  # pyspark is imported inside functions only (docs/ARCHITECTURE.md)
    from pyspark.sql import DataFrame, SparkSession

PAIR_COLUMNS = ("src", "dst")
RELATION = "relation"  # a pair's relation, for per-relation decoders (DistMult, TransE)
MAX_RELATIONS = 100_000  # distinct relations a pairs file may name (checked on the driver)
SHOWN = 5


class PairsError(SparkGNNError, ValueError):
    """The pairs (or an id file) cannot be used: missing columns, nulls, ids the graph lacks."""


def read_pairs(
    spark: SparkSession, path: str, flag: str = "--pairs", *, relation: bool = False, check_nulls: bool = True
) -> DataFrame:
    """(src long, dst long) from the Parquet at `path`; PairsError for missing columns or nulls.
    `relation`: also keep its RELATION column (an integer index, as long, or a relation name, as
    string), required and null-free; without it a relation column is refused, since the decoder
    would score the pairs ignoring it. `check_nulls=False` leaves out the scan for null src / dst
    (a job whose later pass finds them, as score_edges' write_scores does, with refuse_bad_pairs)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType, StringType

    frame = spark.read.parquet(path)
    wanted = (*PAIR_COLUMNS, RELATION) if relation else PAIR_COLUMNS
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        why = " (the decoder scores each pair with its relation)" if RELATION in missing else ""
        raise PairsError(f"{flag} {path} lacks column(s) {', '.join(missing)}{why} (has {', '.join(frame.columns)})")
    if not relation and RELATION in frame.columns:
        raise PairsError(f"{flag} {path} has a {RELATION} column but the model's decoder takes no relation")
    columns = [F.col(c).cast("long").alias(c) for c in PAIR_COLUMNS]
    if relation:
        kind = frame.schema[RELATION].dataType
        if not isinstance(kind, (IntegralType, StringType)):
            raise PairsError(f"{flag} {path}: column {RELATION} must hold integer indices or names, not {kind}")
        columns.append(F.col(RELATION).cast("long" if isinstance(kind, IntegralType) else "string").alias(RELATION))
    frame = frame.select(*columns)
    if check_nulls:
        _refuse_null_ids(frame, f"{flag} {path}")
    if relation and frame.where(F.col(RELATION).isNull()).limit(1).count():
        raise PairsError(f"{flag} {path} has rows with a null {RELATION}")
    return frame


def _refuse_null_ids(pairs: DataFrame, what: str) -> None:
    from pyspark.sql import functions as F

    if pairs.where(F.col("src").isNull() | F.col("dst").isNull()).limit(1).count():
        raise PairsError(f"{what} has rows with a null (or non-integer) src or dst")


def refuse_bad_pairs(pairs: DataFrame, vertices: DataFrame, what: str) -> None:
    """Refuse (PairsError, one line) pairs with a null src or dst, then pairs naming ids that are
    not vertices; returns when there are neither. For a job that found fewer scorable pairs than
    pairs (so only a failing job pays for these scans)."""
    _refuse_null_ids(pairs, what)
    check_known(endpoints(pairs), vertices, what)


def check_relations(pairs: DataFrame, decoder, what: str) -> None:
    """Refuse (PairsError, one line) a pairs' RELATION value the per-relation decoder does not have
    (an index out of range, an unknown name); the distinct values are few, checked on the driver."""
    values = [r[RELATION] for r in pairs.select(RELATION).distinct().limit(MAX_RELATIONS + 1).collect()]
    if len(values) > MAX_RELATIONS:
        raise PairsError(f"{what} name more than {MAX_RELATIONS} distinct relations")
    try:
        decoder.relation_index(values)
    except ValueError as e:
        raise PairsError(f"{what}: {e}; nothing was written") from None


def read_ids(spark: SparkSession, path: str, flag: str) -> DataFrame:
    """(id long) distinct, from the Parquet at `path` (an `id` column); PairsError otherwise."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(path)
    if "id" not in frame.columns:
        raise PairsError(f"{flag} {path} lacks an 'id' column (has {', '.join(frame.columns)})")
    frame = frame.select(F.col("id").cast("long").alias("id"))
    # one scan, no shuffle: rows against non-null ids (the distinct ids below are only planned),
    # where a null check and an emptiness check of the distinct frame ran two shuffled jobs
    rows, ids = frame.agg(F.count(F.lit(1)), F.count("id")).collect()[0]
    if ids != rows:
        raise PairsError(f"{flag} {path} has a null (or non-integer) id")
    if not rows:
        raise PairsError(f"{flag} {path} holds no ids")
    return frame.distinct()


def check_known(ids: DataFrame, vertices: DataFrame, what: str) -> None:
    """Refuse (PairsError, one line) ids (an `id` column) that are not vertices of the graph."""
    unknown = ids.join(vertices.select("id"), on="id", how="left_anti")
    count = unknown.count()
    if count:
        shown = sorted(r.id for r in unknown.limit(SHOWN).collect())
        raise PairsError(
            f"{what} name {count} id(s) the graph does not have "
            f"(e.g. {', '.join(map(str, shown))}); nothing was written"
        )


def endpoints(pairs: DataFrame) -> DataFrame:
    """The distinct ids the pairs name (an `id` column)."""
    from pyspark.sql import functions as F

    return pairs.select(F.col("src").alias("id")).union(pairs.select(F.col("dst").alias("id"))).distinct()
