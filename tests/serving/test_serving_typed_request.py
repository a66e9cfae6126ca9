"""The typed request file (serving/typed_request.py): typed requests written and read back are the
same requests (ids per type, features, a featureless type's queries without x, relations in their
order); malformed typed files are refused in one line naming the file and the problem; the
homogeneous reader refuses a typed file instead of dropping its types."""

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.serving.request import RequestError, parse_request_bytes
from sparkgnn.serving.typed import TypedRequest
from sparkgnn.serving.typed_request import (
    parse_typed_request_bytes,
    typed_requests_table,
    write_typed_requests,
)

WRITES, CITES, TOPIC = ("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "has_topic", "field")


def _bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _requests():
    rng = np.random.default_rng(0)
    one = TypedRequest(
        nodes={
            "paper": ([1000, 1001], rng.standard_normal((2, 6)).astype(np.float32)),
            "author": ([100], rng.standard_normal((1, 4)).astype(np.float32)),
            "field": ([9], None),
        },
        edges={WRITES: ([100, 2], [1000, 1001]), CITES: ([1000], [8]), TOPIC: ([1001], [9])},
        request_id="r1",
    )
    two = TypedRequest({"paper": ([2000], np.ones((1, 6), np.float32))}, request_id="r2")
    return [one, two]


def test_typed_requests_round_trip_through_a_file(tmp_path):
    path = write_typed_requests(str(tmp_path / "in" / "typed.parquet"), _requests())
    with open(path, "rb") as fh:
        back = parse_typed_request_bytes(fh.read(), "typed.parquet")
    assert [r.request_id for r in back] == ["r1", "r2"]
    for got, want in zip(back, _requests(), strict=True):
        assert list(got.nodes) == list(want.nodes) and list(got.edges) == list(want.edges)
        for t, (ids, x) in want.nodes.items():
            np.testing.assert_array_equal(got.nodes[t][0], ids)
            if x is None:
                assert got.nodes[t][1] is None
            else:
                np.testing.assert_array_equal(got.nodes[t][1], x)
        for et, (src, dst) in want.edges.items():
            np.testing.assert_array_equal(got.edges[et][0], src)
            np.testing.assert_array_equal(got.edges[et][1], dst)
    assert back[0].qtype == ["paper", "paper", "author", "field"] and back[0].qid.tolist() == [1000, 1001, 100, 9]
    assert (back[0].batch_size, back[0].num_edges) == (4, 4)


def _set(table: pa.Table, row: int, column: str, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    return table.set_column(
        table.schema.get_field_index(column), column, pa.array(values, table.schema.field(column).type)
    )


def test_malformed_typed_files_are_refused_in_one_line():
    table = typed_requests_table(_requests())
    edge_row = table.column("kind").to_pylist().index("edge")
    cases = {
        "relation 'paper__cites' is not a 'src type__relation__dst type' key": _set(
            table, edge_row, "relation", "paper__cites"
        ),
        "1 node rows have a null type": _set(table, 0, "type", None),
        "1 edge rows have a null relation": _set(table, edge_row, "relation", None),
        "node type 'paper': 1 of its 2 node rows have a null x": _set(table, 0, "x", None),
        "node type 'paper': feature vectors of different lengths [5, 6]": _set(table, 0, "x", [0.5] * 5),
        "lacks column(s) ['type']": table.drop_columns(["type"]),
        "typed requests carry no edge attributes": table.append_column(
            "edge_attr", pa.array([None] * table.num_rows, pa.list_(pa.float32()))
        ),
    }
    for words, bad in cases.items():
        with pytest.raises(RequestError) as info:
            parse_typed_request_bytes(_bytes(bad), "bad.parquet")
        text = str(info.value)
        assert text.startswith("bad.parquet: ") and words in text and "\n" not in text, text
    with pytest.raises(RequestError, match="bad.parquet: a typed request file .*the graph served here is homogeneous"):
        parse_request_bytes(_bytes(table), "bad.parquet")
