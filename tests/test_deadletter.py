"""deadletter: refused bytes kept as received, next to a reason file; rewriting is idempotent."""

import json
import os

from sparkgnn.deadletter import DeadLetter, read_dead_letters


def test_put_keeps_bytes_and_reason_and_is_idempotent(tmp_path):
    dl = DeadLetter(str(tmp_path / "dead"))
    for _ in range(2):  # a replayed micro-batch writes the same names again
        path = dl.put(
            "bad.parquet", b"\x00junk", "bad.parquet: not a readable Parquet file", 4, "file:/in/bad.parquet", 12.5
        )
    assert sorted(os.listdir(dl.root)) == ["bad.parquet", "bad.parquet.reason.json"]
    assert open(os.path.join(dl.root, "bad.parquet"), "rb").read() == b"\x00junk"
    doc = json.load(open(path))
    assert doc == {
        "file": "file:/in/bad.parquet",
        "batch_id": 4,
        "bytes": 5,
        "arrival_ts": 12.5,
        "reason": "bad.parquet: not a readable Parquet file",
    }
    assert read_dead_letters(dl.root) == [doc]
    assert read_dead_letters(str(tmp_path / "none")) == []
