"""intake: request file bytes -> requests, every kind of unusable file refused with its reason."""

import io
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streaming_helpers import write_malformed

from sparkgnn.serving.request import SCHEMA, requests_table
from sparkgnn.streaming.intake import MalformedRequestFile, local_path, parse_request_file


def _bytes(table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def test_parse_round_trips_requests_in_file_order(setup):
    reqs = setup.requests[:3]
    parsed = parse_request_file(_bytes(requests_table(reqs)), "f.parquet")
    assert [r.request_id for r in parsed] == [r.request_id for r in reqs]
    for a, b in zip(parsed, reqs, strict=True):
        np.testing.assert_array_equal(a.qid, b.qid)
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.src, b.src)
        np.testing.assert_array_equal(a.dst, b.dst)


def test_narrower_integer_types_are_cast_not_refused(setup):
    t = requests_table(setup.requests[:1])
    t = t.set_column(t.schema.get_field_index("node"), "node", t.column("node").cast(pa.int32()))
    (r,) = parse_request_file(_bytes(t))
    np.testing.assert_array_equal(r.qid, setup.requests[0].qid)


def test_malformed_files_are_refused_with_their_reason(tmp_path):
    expected = write_malformed(str(tmp_path))
    for name, words in expected.items():
        with open(tmp_path / name, "rb") as fh:
            with pytest.raises(MalformedRequestFile, match=re.escape(words)):
                parse_request_file(fh.read(), name)
    with pytest.raises(MalformedRequestFile, match="empty file"):
        parse_request_file(b"", "e.parquet")
    with pytest.raises(MalformedRequestFile, match="no rows"):
        parse_request_file(_bytes(SCHEMA.empty_table()), "n.parquet")
    bad_type = pa.table(
        {
            "request_id": ["r"],
            "kind": ["node"],
            "node": ["not-a-number"],
            "x": pa.array([[1.0]], pa.list_(pa.float32())),
            "src": pa.array([None], pa.int64()),
            "dst": pa.array([None], pa.int64()),
        }
    )
    with pytest.raises(MalformedRequestFile, match="column types"):
        parse_request_file(_bytes(bad_type), "t.parquet")
    null_node = pa.table(
        {
            "request_id": ["r"],
            "kind": ["node"],
            "node": pa.array([None], pa.int64()),
            "x": pa.array([[1.0]], pa.list_(pa.float32())),
            "src": pa.array([None], pa.int64()),
            "dst": pa.array([None], pa.int64()),
        },
        schema=SCHEMA,
    )
    with pytest.raises(MalformedRequestFile, match="null node"):
        parse_request_file(_bytes(null_node), "z.parquet")


def test_local_path_strips_spark_file_uris():
    assert local_path("file:/a/b.parquet") == "/a/b.parquet"
    assert local_path("file:///a/b.parquet") == "/a/b.parquet"
    assert local_path("/a/b") == "/a/b"
    assert os.path.basename(local_path("file:/x/y/z.parquet")) == "z.parquet"
