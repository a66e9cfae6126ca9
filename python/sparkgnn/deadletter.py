"""DeadLetter: input files a stream cannot read (the streaming job's request files, the refresh
follower's update files), set aside with the reason, so the stream goes on. A module of its own
(no sparkgnn imports) because both the streaming and the PE packages use it.

    <dead>/<file name>                 the file's bytes, exactly as received (none for a file
                                       refused for its size, which is never read)
    <dead>/<file name>.reason.json     {"file", "batch_id", "reason", "bytes", "arrival_ts"}

Both are written to a temp name and renamed, and a replayed micro-batch writes the same names
again, so a dead letter, like an answer, exists once however often its batch runs (sink.py). The
original file stays where it was: the stream source never reads a file twice, and the operator
can fix and re-drop it under a new name.
"""

from __future__ import annotations

import json
import os
import uuid

REASON_SUFFIX = ".reason.json"


class DeadLetter:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def _atomic_write(self, path: str, data: bytes) -> None:
        tmp = os.path.join(self.root, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def put(
        self,
        name: str,
        content: bytes | None,
        reason: str,
        batch_id: int,
        source: str,
        arrival_ts: float | None = None,
        size: int | None = None,
    ) -> str:
        """Store one refused file; returns the path of its reason file. `size` with no
        `content`: a file refused unread (oversize): only its reason is written."""
        target = os.path.join(self.root, os.path.basename(name))
        if content is not None or size is None:
            self._atomic_write(target, content or b"")
        doc = {
            "file": source,
            "batch_id": int(batch_id),
            "reason": reason,
            "bytes": len(content or b"") if size is None else int(size),
            "arrival_ts": arrival_ts,
        }
        reason_path = target + REASON_SUFFIX
        self._atomic_write(reason_path, json.dumps(doc, indent=1).encode())
        return reason_path


def read_dead_letters(root: str) -> list[dict]:
    """Every reason document under `root`, sorted by file name."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(REASON_SUFFIX) and not name.startswith("."):
            with open(os.path.join(root, name)) as fh:
                out.append(json.load(fh))
    return out
