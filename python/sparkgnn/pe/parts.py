"""An in-memory Arrow table written as the Parquet part files of one store folder (a layer's
attempt, a compacted segment, a metrics table), on several threads, each file's CRC-32 taken from
the bytes written.

WHY threads: pyarrow encodes Parquet without the GIL, so the row ranges of a large table encode
side by side on the cores a single-threaded caller leaves idle (the refresh follower's commit,
the single-machine precompute). Each file's CRC-32 (integrity.record's file record) is taken
from the bytes as they are written (files.ChecksummedOutput) instead of reading the file back.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from sparkgnn import files

if TYPE_CHECKING:
    import pyarrow as pa

PART_MIN_ROWS = 16_384  # a table is cut into parts of at least this many rows
MAX_THREADS = 4


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def part_count(rows: int, threads: int | None = None) -> int:
    """How many parts (and threads) a table of `rows` rows is written as: one per PART_MIN_ROWS,
    at most one per core (`threads`, default the machine's, capped at MAX_THREADS), at least one."""
    threads = min(os.cpu_count() or 1, MAX_THREADS) if threads is None else max(int(threads), 1)
    return max(1, min(threads, rows // PART_MIN_ROWS))


def write_parts(table: pa.Table, folder: str, options: dict, *, threads: int | None = None) -> dict[str, str]:
    """Write `table` into `folder` (created) as part_count contiguous row ranges, one Parquet file
    each (pq.write_table keywords `options`); returns {file name: CRC-32 as 8 hex digits}, the
    record integrity.record would read back."""
    import pyarrow.parquet as pq

    files.makedirs(folder)
    count = part_count(table.num_rows, threads)
    step = -(-table.num_rows // count) if table.num_rows else 0

    def write(index: int) -> tuple[str, str]:
        name = part_name(index)
        with files.ChecksummedOutput(files.join(folder, name)) as sink:
            pq.write_table(table.slice(index * step, step) if count > 1 else table, sink, **options)
        return name, sink.crc32

    if count == 1:
        return dict([write(0)])
    with ThreadPoolExecutor(count, thread_name_prefix="sparkgnn-parquet") as pool:
        return dict(pool.map(write, range(count)))
