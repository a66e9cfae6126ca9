"""`read_parquet(spark, *paths)`: `spark.read.parquet`, without the Spark job that infers the schema.

Why: Spark infers a Parquet read's schema by reading a footer in a Spark job (ParquetUtils'
mergeSchemasInParallel runs one even when it touches a single file), and that job costs about as
much as the work of a small step (0.15-0.4 s warm on a local master, more on a cluster). A job
reads a graph's two folders, every store layer segment and the folders it wrote itself, so a
small job paid several such jobs for nothing. Where the files are on a local filesystem the driver
reads (a plain path or file: URI; under local-cluster and a shared work dir that is also what the
executors read), the driver reads the same footer itself (one small read) and hands Spark the
schema: the Spark schema Spark wrote into the footer (org.apache.spark.sql.parquet.row.metadata),
else the file's Parquet schema as Arrow types (what Spark's own inference maps them to). Spark
then plans the read without a job; the DataFrame is the one inference would give.

Anything else reads as Spark reads it: remote paths (s3://, hdfs://: Spark's filesystems, not this
process's), a folder partitioned into `name=value` subfolders (Spark adds the partition columns
from the folder names), a folder without data files (Spark's own error names it), a footer that
does not parse or a type Arrow cannot map.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from sparkgnn import files

log = logging.getLogger(__name__)

#: The footer key under which Spark records the schema of the rows it wrote.
SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"


def read_parquet(spark: Any, *paths: str) -> Any:
    """`spark.read.parquet(*paths)` with the schema taken from the first data file's footer where
    the driver can read it (module doc); the same DataFrame either way."""
    schema = footer_schema(paths)
    reader = spark.read if schema is None else spark.read.schema(schema)
    return reader.parquet(*paths)


def footer_schema(paths: tuple[str, ...] | list[str]) -> Any | None:
    """The Spark StructType of the first data file among `paths` (files, or folders whose data
    files lie directly in them), or None where Spark must infer it (module doc)."""
    if not paths or not all(files.is_local(p) for p in paths):
        return None
    first: str | bool | None = None
    for path in paths:
        first = _first_data_file(files.filesystem(path)[1])
        if first is not False:
            break
    if not isinstance(first, str):
        return None
    try:
        return _schema_of(first)
    except Exception as exc:  # noqa: BLE001 - any footer or type problem: Spark infers as before
        log.debug("sparkgnn: Spark infers the schema of %s (%s)", first, exc)
        return None


def _first_data_file(path: str) -> str | None | bool:
    """The first data file (by name) of `path`: the path itself when it is a file; False for a
    folder without data files (look at the next path); None where Spark must infer (a
    partitioned or unreadable folder)."""
    if os.path.isfile(path):
        return path
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return None
    found = None
    for entry in entries:
        if not files.is_data_name(entry.name):
            continue
        if entry.is_dir():
            return None  # partition folders (name=value) or nested data: Spark lists them
        if found is None:
            found = entry.path
    return found if found is not None else False


def _schema_of(path: str) -> Any:
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    parquet = pq.ParquetFile(path)
    written = (parquet.metadata.metadata or {}).get(SPARK_ROW_METADATA)
    if written:
        return StructType.fromJson(json.loads(written))
    # the Parquet schema itself, not the Arrow schema pyarrow stores beside it: Spark reads the
    # former (a fixed-size list, say, is a plain list in Parquet and to Spark)
    return from_arrow_schema(parquet.schema.to_arrow_schema())


__all__ = ["SPARK_ROW_METADATA", "footer_schema", "read_parquet"]
