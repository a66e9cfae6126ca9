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
SHOWN = 5


class PairsError(SparkGNNError, ValueError):
    """The pairs (or an id file) cannot be used: missing columns, nulls, ids the graph lacks."""


def read_pairs(spark: SparkSession, path: str, flag: str = "--pairs") -> DataFrame:
    """(src long, dst long) from the Parquet at `path`; PairsError for missing columns or nulls."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(path)
    missing = [c for c in PAIR_COLUMNS if c not in frame.columns]
    if missing:
        raise PairsError(f"{flag} {path} lacks column(s) {', '.join(missing)} (has {', '.join(frame.columns)})")
    frame = frame.select(*(F.col(c).cast("long").alias(c) for c in PAIR_COLUMNS))
    nulls = frame.where(F.col("src").isNull() | F.col("dst").isNull()).limit(1).count()
    if nulls:
        raise PairsError(f"{flag} {path} has rows with a null (or non-integer) src or dst")
    return frame


def read_ids(spark: SparkSession, path: str, flag: str) -> DataFrame:
    """(id long) distinct, from the Parquet at `path` (an `id` column); PairsError otherwise."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(path)
    if "id" not in frame.columns:
        raise PairsError(f"{flag} {path} lacks an 'id' column (has {', '.join(frame.columns)})")
    frame = frame.select(F.col("id").cast("long").alias("id")).distinct()
    if frame.where(F.col("id").isNull()).limit(1).count():
        raise PairsError(f"{flag} {path} has a null (or non-integer) id")
    if not frame.limit(1).count():
        raise PairsError(f"{flag} {path} holds no ids")
    return frame


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
