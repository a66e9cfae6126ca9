"""Wire protocol: round trip, every header field, and each malformed input named precisely."""

import json
import os
import pathlib
import re

import numpy as np
import pyarrow as pa
import pytest

from sparkgnn.messenger import hashing
from sparkgnn.messenger.protocol import PROTOCOL_VERSION, Kind, ProtocolError, control, decode, encode, encode_header

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tables(n=100, dim=8):
    x = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    return {
        "x": pa.table(
            {"id": np.arange(n, dtype=np.int64), "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), dim)}
        ),
        "edges": pa.table({"src": [1, 2], "dst": [2, 3]}),
    }


def test_round_trip_carries_header_fields_and_tables():
    frames = encode(
        {"kind": Kind.TASK, "job": "j1", "batch": 7, "op": "sage.aggregate", "layer": 1, "model": "abc123"}, tables()
    )
    assert len(frames) == 3
    header, out = decode(frames, 1 << 30)
    assert header["v"] == PROTOCOL_VERSION and header["kind"] == "TASK"
    assert (header["job"], header["batch"], header["op"], header["layer"], header["model"]) == (
        "j1",
        7,
        "sage.aggregate",
        1,
        "abc123",
    )
    assert header["tables"] == ["x", "edges"]
    assert header["rows"] == {"x": 100, "edges": 2}
    assert header["hash"].startswith(hashing.DEFAULT + ":")
    assert out["x"].equals(tables()["x"]) and out["edges"].equals(tables()["edges"])


def test_decode_accepts_zmq_frames_zero_copy():
    zmq = pytest.importorskip("zmq")
    frames = [zmq.Frame(bytes(f)) for f in encode({"kind": "RESULT"}, tables())]
    header, out = decode(frames, 1 << 30)
    assert out["x"].num_rows == 100


def test_control_message_has_no_payload():
    header, out = decode(control(Kind.HEARTBEAT, note="hi"), 1024)
    assert header["kind"] == "HEARTBEAT" and header["note"] == "hi" and out == {}


def _reencoded(frames, **changes):
    header = json.loads(bytes(frames[0]))
    header.update(changes)
    return [json.dumps(header).encode()] + list(frames[1:])


@pytest.mark.parametrize(
    "make_frames, message",
    [
        (lambda f: [os.urandom(300)], "not JSON"),
        (lambda f: [], "empty message"),
        (lambda f: [b"[1, 2]"], "not an object"),
        (lambda f: _reencoded(f, v=99), "protocol version 99"),
        (lambda f: _reencoded(f, kind="EXPLODE"), "unknown kind 'EXPLODE'"),
        (lambda f: f[:2], "header names 2 tables but the message has 1 payload frames"),
        (lambda f: [f[0], f[1], bytes(f[2])[:-8]], "payload hash mismatch"),
        (lambda f: _reencoded(f, hash="md5:00"), "unknown payload hash algorithm 'md5'"),
        (lambda f: _reencoded(f, rows={"x": 5, "edges": 2}), "table 'x' has 100 rows, header says 5"),
        (lambda f: [b"{" + b" " * 70000 + b"}"], "header frame is 70002 bytes"),
    ],
)
def test_malformed_messages_raise_protocol_error_naming_the_problem(make_frames, message):
    frames = make_frames(encode({"kind": "TASK", "batch": 1}, tables()))
    with pytest.raises(ProtocolError, match=re.escape(message)):
        decode(frames, 1 << 30)


def test_truncated_arrow_with_a_matching_hash_is_still_caught():
    frames = encode({"kind": "TASK", "batch": 1}, tables())
    cut = bytes(frames[1])[: len(frames[1]) // 2]
    header = json.loads(bytes(frames[0]))
    header["hash"] = hashing.digest([cut, frames[2]])
    with pytest.raises(ProtocolError, match="table 'x': truncated or invalid Arrow IPC stream"):
        decode([json.dumps(header).encode(), cut, frames[2]], 1 << 30)


def test_oversize_message_is_refused_before_parsing():
    frames = encode({"kind": "TASK"}, tables())
    size = sum(len(f) if isinstance(f, bytes) else f.size for f in frames)
    with pytest.raises(ProtocolError, match=f"oversize message: {size} bytes > cap 1000"):
        decode(frames, 1000)


def test_encode_refuses_unknown_kind_and_non_json_header():
    with pytest.raises(ProtocolError, match="unknown kind"):
        encode({"kind": "NOPE"}, {})
    with pytest.raises(ProtocolError, match="not plain JSON"):
        encode({"kind": "TASK", "obj": object()}, {})
    with pytest.raises(ProtocolError, match="not plain JSON"):
        encode_header({"kind": "TASK", "x": float("nan")})


def test_no_pickle_or_eval_anywhere_in_the_messenger():
    pattern = re.compile(r"\b(pickle|cPickle|marshal|eval|exec)\b\s*[.(]|import\s+(pickle|marshal)")
    offenders = [str(p) for p in (ROOT / "messenger").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
