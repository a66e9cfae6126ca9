"""The HTTP bodies' strict schemas: unknown or misspelt keys are refused naming the key and the
expected ones, types are exact (no booleans or strings as numbers, int64 ids), a deeply nested
body is refused at its first bracket (one line, no RecursionError), and a swap's timeout_s must
be a finite number of seconds in [1, 86400]."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sparkgnn.serving.online.bodies import (
    HOMOGENEOUS_BODY_TO_TYPED,
    TYPED_BODY_TO_HOMOGENEOUS,
    BodyError,
    check_swap_timeout,
    decode_answer,
    decode_swap,
    decode_typed_answer,
    request_of,
    typed_request_json,
    typed_request_of,
)
from sparkgnn.serving.request import RequestError
from sparkgnn.serving.typed import TypedRequest


def body(**fields) -> bytes:
    return json.dumps({"nodes": [{"id": 10_000, "x": [1.0, 2.0]}], **fields}).encode()


def test_a_valid_body_becomes_the_request_it_describes():
    parsed = decode_answer(body(edges=[[10_000, 3], [4, 10_000]], request_id="r1", mode="he"))
    request = request_of(parsed)
    assert parsed.mode == "he" and request.request_id == "r1"
    np.testing.assert_array_equal(request.qid, [10_000])
    np.testing.assert_array_equal(request.x, np.array([[1.0, 2.0]], np.float32))
    np.testing.assert_array_equal(request.src, [10_000, 4])
    np.testing.assert_array_equal(request.dst, [3, 10_000])
    bare = request_of(decode_answer(body()))  # no edges: isolated queries; no id: "http"
    assert bare.num_edges == 0 and bare.request_id == "http"


@pytest.mark.parametrize("key", ["edge", "weights", "nodez"])
def test_an_unknown_top_level_key_is_refused_naming_it_and_the_expected_ones(key):
    with pytest.raises(BodyError) as info:
        decode_answer(body(**{key: [[10_000, 1]]}))
    message = str(info.value)
    assert f"unknown key {key!r}" in message
    assert "expected one of: deadline_ms, edge_attr, edges, mode, nodes, request_id" in message
    assert "\n" not in message


def test_an_unknown_node_key_names_the_node_and_its_keys():
    raw = json.dumps({"nodes": [{"id": 1, "x": [1.0]}, {"id": 2, "x": [1.0], "features": [2.0]}]}).encode()
    with pytest.raises(BodyError, match=r"unknown key 'features' in \$\.nodes\[1\]; expected one of: id, x"):
        decode_answer(raw)


@pytest.mark.parametrize(
    "x, where",
    [([True, 1.0], "bool"), (["1.5", 1.0], "str"), ([None, 1.0], "null"), ([[1.0], 1.0], "array")],
)
def test_features_must_be_numbers_not_booleans_strings_or_lists(x, where):
    raw = json.dumps({"nodes": [{"id": 1, "x": x}]}).encode()
    with pytest.raises(BodyError, match=rf"Expected `float`, got `{where}` - at `\$\.nodes\[0\]\.x\[0\]`"):
        decode_answer(raw)


@pytest.mark.parametrize("node_id", ["7", 1.5, True, 2**63])
def test_ids_must_be_int64(node_id):
    raw = json.dumps({"nodes": [{"id": node_id, "x": [1.0]}]}).encode()
    with pytest.raises(BodyError, match=r"\$\.nodes\[0\]\.id"):
        decode_answer(raw)


def test_edges_are_pairs_and_request_ids_strings():
    with pytest.raises(BodyError, match=r"length 2 - at `\$\.edges\[0\]`"):
        decode_answer(body(edges=[[1, 2, 3]]))
    with pytest.raises(BodyError, match=r"Expected `str`, got `int` - at `\$\.request_id`"):
        decode_answer(body(request_id=7))
    with pytest.raises(BodyError, match="missing key 'nodes'"):
        decode_answer(b'{"edges": []}')


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"nodes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"nodes": [{"id": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
        b'{"junk": ' + b"[" * 100_000 + b"]" * 100_000 + b', "nodes": []}',
    ],
)
def test_a_deeply_nested_body_is_one_line_not_a_recursion_error(raw):
    with pytest.raises(BodyError) as info:
        decode_answer(raw)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    assert not isinstance(info.value.__context__, RecursionError)


def test_malformed_json_and_wrong_shape_are_refused():
    with pytest.raises(BodyError, match="the request body is not JSON"):
        decode_answer(b'{"nodes": [')
    with pytest.raises(BodyError, match="Expected `object`, got `array`"):
        decode_answer(b"[]")


def test_ragged_features_are_refused_by_the_request():
    raw = json.dumps({"nodes": [{"id": 1, "x": [1.0, 2.0]}, {"id": 2, "x": [1.0]}]}).encode()
    with pytest.raises(RequestError, match="ragged"):
        request_of(decode_answer(raw))


def test_swap_bodies_are_strict_and_bound_timeout_s():
    swap = decode_swap(b'{"graph": "/g2", "store": "/s", "timeout_s": 30}')
    assert (swap.graph, swap.store, swap.timeout_s) == ("/g2", "/s", 30.0)
    assert decode_swap(b'{"graph": "/g2"}').timeout_s == 300.0
    for raw, why in [
        (b'{"graph": "/g2", "timeout_s": 1e-9}', ">= 1.0"),
        (b'{"graph": "/g2", "timeout_s": 1e9}', "<= 86400.0"),
        (b'{"graph": "/g2", "timeout_s": Infinity}', "not JSON"),
        (b'{"graph": "/g2", "timeout_s": 1e999}', "out of range"),
        (b'{"graph": "/g2", "timeout_s": true}', "got `bool`"),
        (b'{"graph": ""}', "length >= 1"),
        (b'{"graph": "/g2", "stroe": "/s"}', "unknown key 'stroe'; expected one of: graph, store, timeout_s"),
        (b"[" * 100_000 + b"]" * 100_000, "Expected `object`"),
    ]:
        with pytest.raises(BodyError, match=why):
            decode_swap(raw)


def test_check_swap_timeout_refuses_non_finite_and_tiny_values():
    assert check_swap_timeout(5) == 5.0
    for bad in (float("inf"), float("nan"), 1e-9, 0, -1, True, "5"):
        with pytest.raises(BodyError, match="timeout_s"):
            check_swap_timeout(bad)


def test_edge_attributes_ride_with_the_edges_one_row_each():
    request = request_of(decode_answer(body(edges=[[10_000, 3], [4, 10_000]], edge_attr=[[0.5, 1.0], [2.0, 3.0]])))
    np.testing.assert_array_equal(request.edge_attr, np.array([[0.5, 1.0], [2.0, 3.0]], np.float32))
    assert request_of(decode_answer(body(edges=[[10_000, 3]]))).edge_attr is None
    with pytest.raises(BodyError, match="edge_attr has 1 rows, edges has 2"):
        request_of(decode_answer(body(edges=[[10_000, 3], [4, 10_000]], edge_attr=[[0.5]])))
    with pytest.raises(BodyError, match=r"edge_attr rows of different lengths \[1, 2\]"):
        request_of(decode_answer(body(edges=[[10_000, 3], [4, 10_000]], edge_attr=[[0.5], [1.0, 2.0]])))
    with pytest.raises(BodyError, match="edge_attr"):
        decode_answer(body(edges=[[10_000, 3]], edge_attr=[["a"]]))
    assert request_of(decode_answer(body(edges=[], edge_attr=[]))).edge_attr is None  # no edges, no rows
    with pytest.raises(BodyError, match=r"edge_attr rows are empty \(each edge needs D >= 1 values\)"):
        request_of(decode_answer(body(edges=[[10_000, 3]], edge_attr=[[]])))


def test_a_typed_body_reads_back_to_the_typed_request_it_was_written_from():
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    request = TypedRequest(
        nodes={"paper": ([1000, 1001], np.arange(4, dtype=np.float32).reshape(2, 2)), "field": ([9], None)},
        edges={writes: ([7], [1000]), cites: ([1000, 3], [3, 1001])},
        request_id="t1",
    )
    raw = json.dumps(typed_request_json(request, "exact")).encode()
    parsed = decode_typed_answer(raw)
    back = typed_request_of(parsed)
    assert parsed.mode == "exact" and back.request_id == "t1"
    assert list(back.nodes) == ["paper", "field"] and list(back.edges) == [writes, cites]
    np.testing.assert_array_equal(back.nodes["paper"][0], [1000, 1001])
    np.testing.assert_array_equal(back.nodes["paper"][1], request.nodes["paper"][1])
    assert back.nodes["field"][1] is None
    np.testing.assert_array_equal(back.edges[cites][0], [1000, 3])
    np.testing.assert_array_equal(back.edges[cites][1], [3, 1001])


def test_a_typed_body_at_a_homogeneous_decoder_and_the_reverse_are_named_as_such():
    typed = json.dumps({"nodes": [{"type": "paper", "id": 1, "x": [1.0]}]}).encode()
    with pytest.raises(BodyError) as info:
        decode_answer(typed)
    assert str(info.value) == TYPED_BODY_TO_HOMOGENEOUS
    with pytest.raises(BodyError) as info:
        decode_typed_answer(body(edges=[[10_000, 3]]))
    assert str(info.value) == HOMOGENEOUS_BODY_TO_TYPED
    # a typed body with a misspelt key is named by its own schema, not called homogeneous
    edge = {"relation": ["paper", "cites", "paper"], "src": 1, "dts": 2}
    with pytest.raises(BodyError, match=r"unknown key 'dts' in \$\.edges\[0\]; expected one of: dst, relation, src"):
        decode_typed_answer(json.dumps({"nodes": [{"type": "paper", "id": 1}], "edges": [edge]}).encode())


def test_a_typed_body_whose_type_carries_features_some_but_not_all_is_refused():
    nodes = [{"type": "paper", "id": 1, "x": [1.0]}, {"type": "paper", "id": 2}]
    with pytest.raises(BodyError, match="node type 'paper': 1 of its 2 query nodes carry x"):
        typed_request_of(decode_typed_answer(json.dumps({"nodes": nodes}).encode()))
    nodes = [{"type": "paper", "id": 1, "x": [1.0]}, {"type": "paper", "id": 2, "x": [1.0, 2.0]}]
    with pytest.raises(BodyError, match=r"node type 'paper': x rows of different lengths \[1, 2\]"):
        typed_request_of(decode_typed_answer(json.dumps({"nodes": nodes}).encode()))
