"""pe/follow_checkpoint.py: the follower's checkpoint as a constant-size document plus a batch
journal -- read back whole, the newer document taken only when the journal holds its lines,
lines no document counts cut off, a document of another format or ahead of its synced journal
refused with one line."""

import json
import os

import pytest

from sparkgnn.pe.follow_checkpoint import (
    CHECKPOINT_FILE,
    JOURNAL_FILE,
    PENDING_FILE,
    CheckpointFiles,
    read_checkpoint,
)
from sparkgnn.pe.follow_state import FollowError


def _batch(k, dead=()):
    return {"batch": k, "files": [f"{k}.parquet", *dead], "applied": [f"{k}.parquet"], "dead": list(dead)}


_SEQ = {"seq": 0}


def _checkpoint(batches, pending=None):
    """A follower's checkpoint dict; `seq` runs on across calls as in the one dict a follower keeps."""
    _SEQ["seq"] += 1
    return {
        "base_graph_fingerprint": "g0",
        "store": "/s",
        "batches": batches,
        "dead": [n for b in batches for n in b["dead"]],
        "pending": pending,
        "committed": 0,
        "seq": _SEQ["seq"],
    }


def test_batches_and_dead_letters_read_back_from_the_journal(tmp_path):
    state = str(tmp_path)
    found, writer = CheckpointFiles.load(state)
    assert found is None and read_checkpoint(state) is None
    batches = [_batch(1), _batch(2, dead=["x.parquet"])]
    writer.write(_checkpoint(batches))  # synced
    batches.append(_batch(3))
    writer.write(_checkpoint(batches, pending={"batch": 4, "files": ["4.parquet"]}))
    got = read_checkpoint(state)
    assert got["batches"] == batches and got["dead"] == ["x.parquet"] and got["pending"]["batch"] == 4
    with open(os.path.join(state, PENDING_FILE)) as fh:
        doc = json.load(fh)
    assert doc["batches_done"] == 3 and doc["dead_letters"] == 1 and "batches" not in doc and "dead" not in doc


def test_a_journal_behind_the_pending_document_falls_back_and_is_cut(tmp_path):
    state = str(tmp_path)
    _found, writer = CheckpointFiles.load(state)
    writer.write(_checkpoint([_batch(1)]))  # synced: one line
    writer.write(_checkpoint([_batch(1), _batch(2)], pending={"batch": 3, "files": []}))
    journal = os.path.join(state, JOURNAL_FILE)
    with open(journal, "r+b") as fh:
        fh.truncate(os.path.getsize(journal) - 3)  # line 2 torn
    found, writer = CheckpointFiles.load(state)
    assert [b["batch"] for b in found["batches"]] == [1] and found["pending"] is None
    with open(journal, "rb") as fh:
        assert fh.read().count(b"\n") == 1 and os.path.getsize(journal) == len(json.dumps(_batch(1))) + 1
    writer.write(_checkpoint([_batch(1), _batch(5)]))  # appends after the whole line
    assert [b["batch"] for b in read_checkpoint(state)["batches"]] == [1, 5]


def test_a_synced_document_ahead_of_its_journal_or_of_another_format_is_refused(tmp_path):
    state = str(tmp_path)
    _found, writer = CheckpointFiles.load(state)
    writer.write(_checkpoint([_batch(1), _batch(2)]))
    os.truncate(os.path.join(state, JOURNAL_FILE), 0)
    with pytest.raises(FollowError, match="counts 2 batches but batches.jsonl holds 0"):
        read_checkpoint(state)
    with open(os.path.join(state, CHECKPOINT_FILE), "w") as fh:
        json.dump({"format": 1, "batches": [], "dead": [], "pending": None, "seq": 9}, fh)
    with pytest.raises(FollowError, match="checkpoint format 1"):
        read_checkpoint(state)
