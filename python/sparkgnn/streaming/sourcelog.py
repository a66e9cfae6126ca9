"""Which files Spark's file source assigned to a micro-batch, read from the checkpoint's source log.

WHY: the binaryFile source records every new file in <checkpoint>/sources/0/<batch id> (one JSON
line per file: path, modification time, batch id) BEFORE the batch runs, which is what makes it
consume each file once. But the DataFrame that foreachBatch receives is built by Spark's file
index, which drops 0-byte files (PartitioningAwareFileIndex.isNonEmptyFile). An empty request file
was therefore marked consumed and then never seen: not answered, not dead-lettered, not logged.
The handler compares the files of this log with the rows it got, and treats every file it did
not get as a file it must refuse (handler.py), so nothing the source consumed goes unaccounted.

Log format (Spark's FileStreamSourceLog, "v1"): a version line, then one JSON object per line.
Every `compactInterval` batches (default 10) the entries of all batches so far are written to
`<id>.compact` instead of `<id>`, hence both names are read and entries filtered by batchId.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

SOURCE_DIR = os.path.join("sources", "0")  # the job has exactly one source


@dataclass(frozen=True)
class LoggedFile:
    path: str  # local path (URI decoded)
    arrival_ts: float  # modification time, epoch seconds


def uri_to_local(uri: str) -> str:
    """A log entry's path, a percent-encoded URI ('file:///a/b%20c.parquet'), -> '/a/b c.parquet':
    the form intake.local_path gives for the binaryFile `path` column (which is not encoded)."""
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def _log_files(log_dir: str, batch_id: int) -> list[str]:
    return [
        p
        for p in (os.path.join(log_dir, str(batch_id)), os.path.join(log_dir, f"{batch_id}.compact"))
        if os.path.isfile(p)
    ]


def batch_files(checkpoint: str, batch_id: int) -> list[LoggedFile] | None:
    """The files the source assigned to `batch_id`, in log order; None when the checkpoint has no
    log entry for it (not a file-source checkpoint, or a layout this module does not know)."""
    found = _log_files(os.path.join(checkpoint, SOURCE_DIR), int(batch_id))
    if not found:
        return None
    out, seen = [], set()
    for path in found:
        with open(path) as fh:
            lines = fh.read().splitlines()
        for line in lines[1:]:  # lines[0] is the version ("v1")
            if not line.strip():
                continue
            entry = json.loads(line)
            if int(entry.get("batchId", -1)) != int(batch_id):
                continue
            local = uri_to_local(str(entry["path"]))
            if local not in seen:
                seen.add(local)
                out.append(LoggedFile(local, float(entry.get("timestamp", 0)) / 1e3))
    return out
