"""Graph updates: the Parquet format, validation (every problem named, with its ids) and apply()
(exact results on a hand-made multigraph, and a random graph against a pure-Python reference)."""

import os
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pytest

from sparkgnn.errors import GraphUpdateError, OutputError, SparkGNNError
from sparkgnn.graph import GraphData
from sparkgnn.graph.updates import KINDS, UPDATE_SCHEMA, GraphUpdate, apply, validate

NAN = float("nan")


def graph(weighted: bool = True) -> GraphData:
    """Five vertices; (10 -> 20) three times (weights 1, 3, 1): a multigraph.

    position: 0: 10->20 w1  1: 20->30 w2  2: 10->20 w3  3: 30->40 w1  4: 40->50 w1  5: 50->10 w2  6: 10->20 w1
    """
    ids = [10, 20, 30, 40, 50]
    x = [[1, 0], [2, 0], [3, 0], [4, 0], [5, 0]]
    src = [10, 20, 10, 30, 40, 50, 10]
    dst = [20, 30, 20, 40, 50, 10, 20]
    weight = [1.0, 2.0, 3.0, 1.0, 1.0, 2.0, 1.0] if weighted else None
    y = [0, 1, -1, 2, 1]
    split = ["train", "val", "", "test", "train"]
    return GraphData.from_edge_ids(ids, x, src, dst, weight=weight, y=y, split=split, name="tiny")


def edges(data: GraphData) -> list:
    weight = data.weight if data.weight is not None else [None] * data.num_edges
    return [
        (int(s), int(d), None if w is None else float(w))
        for s, d, w in zip(data.src_ids, data.dst_ids, weight, strict=True)
    ]


def failure(update: GraphUpdate, data: GraphData) -> str:
    with pytest.raises(GraphUpdateError) as err:
        validate(update, data)
    return str(err.value)


def table(rows: list[dict], schema: pa.Schema = UPDATE_SCHEMA) -> pa.Table:
    """An update table from row dicts; absent keys are null."""
    return pa.table(
        {name: pa.array([row.get(name) for row in rows], type=schema.field(name).type) for name in schema.names}
    )


def every_kind() -> GraphUpdate:
    return GraphUpdate(
        vertex_delete_ids=[30],
        vertex_insert_ids=[60, 70],
        vertex_insert_x=[[6, 6], [7, 7]],
        feature_update_ids=[40, 10],
        feature_update_x=[[9, 9], [1, 0]],  # 10 gets its own x again: not a change
        edge_delete_src=[10, 40],
        edge_delete_dst=[20, 50],
        edge_delete_weight=[3.0, NAN],  # (10 -> 20) of weight 3; any (40 -> 50)
        edge_insert_src=[60, 70, 40],
        edge_insert_dst=[10, 40, 50],
        edge_insert_weight=[0.5, 1.5, 4.0],  # (40 -> 50) deleted and re-inserted with a new weight
    )


# --- the format ----------------------------------------------------------------------------------------


def test_counts_empty_and_repr():
    update = every_kind()
    assert update.counts() == {
        "edge_insert": 3,
        "edge_delete": 2,
        "vertex_insert": 2,
        "feature_update": 2,
        "vertex_delete": 1,
    }
    assert list(update.counts()) == list(KINDS)
    assert not update.empty and GraphUpdate().empty
    assert repr(GraphUpdate(vertex_delete_ids=[1])).endswith("vertex_delete=1)")


def _assert_same_update(a: GraphUpdate, b: GraphUpdate):
    for name in a.__dataclass_fields__:
        left, right = getattr(a, name), getattr(b, name)
        assert (left is None) == (right is None), name
        if left is not None:
            assert left.dtype == right.dtype, name
            np.testing.assert_array_equal(left, right, err_msg=name)


def test_table_round_trip():
    update = every_kind()
    as_table = update.to_table()
    assert as_table.schema == UPDATE_SCHEMA
    assert as_table.column("kind").to_pylist() == ["edge_insert"] * 3 + ["edge_delete"] * 2 + [
        "vertex_insert",
        "vertex_insert",
        "feature_update",
        "feature_update",
        "vertex_delete",
    ]
    assert as_table.column("weight").to_pylist()[:5] == [0.5, 1.5, 4.0, 3.0, None]  # NaN is written as null
    assert as_table.column("x").to_pylist()[5:] == [[6, 6], [7, 7], [9, 9], [1, 0], None]
    assert as_table.column("node").to_pylist()[:5] == [None] * 5
    _assert_same_update(update, GraphUpdate.from_table(as_table))


def test_write_and_read_a_file(tmp_path):
    update = every_kind()
    path = update.write(tmp_path / "day1.parquet")
    assert os.listdir(tmp_path) == ["day1.parquet"]  # the temporary file was renamed, none left
    _assert_same_update(update, GraphUpdate.read(path))
    _assert_same_update(update, GraphUpdate.read(f"file:{path}"))
    with pytest.raises(OutputError, match="already exists"):
        GraphUpdate().write(path)
    assert GraphUpdate.read(path).counts()["edge_insert"] == 3  # the refused write left it as it was


def test_read_a_folder(tmp_path):
    """A folder of part files (as a Spark job writes it): kinds and rows of a kind in file order."""
    folder = tmp_path / "day2"
    GraphUpdate(vertex_insert_ids=[60], vertex_insert_x=[[6, 6]], edge_delete_src=[10], edge_delete_dst=[20]).write(
        folder / "part-00000.parquet"
    )
    GraphUpdate(vertex_insert_ids=[70], vertex_insert_x=[[7, 7]]).write(folder / "part-00001.parquet")
    (folder / "_SUCCESS").write_text("")
    update = GraphUpdate.read(folder)
    assert update.counts() == {**dict.fromkeys(KINDS, 0), "vertex_insert": 2, "edge_delete": 1}
    np.testing.assert_array_equal(update.vertex_insert_ids, [60, 70])
    np.testing.assert_array_equal(update.vertex_insert_x, [[6, 6], [7, 7]])
    assert update.edge_delete_weight is None


def test_empty_update_round_trip(tmp_path):
    update = GraphUpdate.read(GraphUpdate().write(tmp_path / "none.parquet"))
    assert update.empty
    applied = apply(update, graph())
    assert edges(applied.graph) == edges(graph())
    np.testing.assert_array_equal(applied.kept_edges, np.arange(7))
    assert len(applied.removed_edges) == len(applied.inserted_edges) == len(applied.feature_changed) == 0


def test_read_missing_path_and_empty_folder(tmp_path):
    with pytest.raises(GraphUpdateError, match="does not exist"):
        GraphUpdate.read(tmp_path / "nope.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphUpdateError, match="holds no Parquet files"):
        GraphUpdate.read(tmp_path / "empty")


def test_unknown_kinds_are_named_with_counts():
    rows = [{"kind": "edge_upsert", "src": 1, "dst": 2}] * 3 + [{"kind": None}, {"kind": "vertex_delete", "node": 5}]
    with pytest.raises(GraphUpdateError) as err:
        GraphUpdate.from_table(table(rows))
    assert (
        "4 rows have an unknown kind: 'edge_upsert' (x3), null (x1); expected one of edge_insert, edge_delete, "
        "vertex_insert, feature_update, vertex_delete"
    ) in str(err.value)
    assert isinstance(err.value, SparkGNNError) and isinstance(err.value, ValueError)
    many = [{"kind": f"k{i}"} for i in range(7)]
    with pytest.raises(GraphUpdateError, match=r"7 rows have an unknown kind: 'k0' \(x1\), .*'k4' \(x1\), \.\.\.;"):
        GraphUpdate.from_table(table(many))


def test_missing_and_mistyped_columns():
    with pytest.raises(GraphUpdateError, match=r"1 required column\(s\) missing: kind"):
        GraphUpdate.from_table(pa.table({"src": [1]}))
    only_edges = pa.table({"kind": ["edge_insert", "vertex_insert"], "src": [1, None], "node": [None, 7]})
    with pytest.raises(GraphUpdateError) as err:
        GraphUpdate.from_table(only_edges)
    assert "2 required column(s) missing: dst (needed by edge_insert), x (needed by vertex_insert)" in str(err.value)
    mistyped = pa.table({"kind": ["vertex_delete"], "node": [1.5], "x": ["a"]})
    with pytest.raises(GraphUpdateError) as err:
        GraphUpdate.from_table(mistyped)
    assert "2 column(s) have the wrong type: node is double, expected int64, x is string, expected list<float32>" in (
        str(err.value)
    )


def test_columns_a_kind_does_not_use_may_be_absent():
    """An edge-only update needs no node/x column; any integer / float types are accepted."""
    update = GraphUpdate.from_table(
        pa.table(
            {
                "kind": pa.array(["edge_delete", "edge_delete"], pa.large_string()),
                "src": pa.array([10, 10], pa.int32()),
                "dst": pa.array([20, 20], pa.int32()),
                "weight": pa.array([1.0, None], pa.float64()),
            }
        )
    )
    np.testing.assert_array_equal(update.edge_delete_src, [10, 10])
    np.testing.assert_array_equal(update.edge_delete_weight, [1.0, NAN])


def test_columns_of_nulls_only_are_accepted():
    """pa.table() types a column of Python Nones as null; it still reads (as "no weight" here)."""
    update = GraphUpdate.from_table(pa.table({"kind": ["edge_insert"], "src": [1], "dst": [2], "weight": [None]}))
    assert update.edge_insert_weight is None and update.counts()["edge_insert"] == 1


def test_nulls_where_a_kind_needs_a_value():
    rows = [
        {"kind": "edge_insert", "src": 1, "dst": 2},
        {"kind": "edge_insert", "src": None, "dst": 2},
        {"kind": "vertex_delete"},
        {"kind": "vertex_insert", "node": 8, "x": None},
        {"kind": "edge_delete", "src": 1, "dst": 2, "weight": NAN},
        {"kind": "feature_update", "node": 9, "x": [1.0]},
        {"kind": "feature_update", "node": 4, "x": [1.0, 2.0]},
        {"kind": "feature_update", "node": 3, "x": [1.0, 2.0]},
    ]
    with pytest.raises(GraphUpdateError) as err:
        GraphUpdate.from_table(table(rows))
    text = str(err.value)
    assert "failed validation (5 problems)" in text
    assert "edge_insert: 1 rows have a null src; first rows: 1" in text
    assert "vertex_delete: 1 rows have a null node; first rows: 2" in text
    assert "vertex_insert: 1 vertices have a null feature vector x; first ids: 8" in text
    assert "edge_delete: 1 rows have a NaN weight (leave it null for 'no weight'); first rows: 4" in text
    assert "feature_update: 1 vertices have a feature vector whose length is not 2; first: id 9 (len 1)" in text


def test_inconsistent_arrays_are_refused():
    with pytest.raises(GraphUpdateError) as err:
        GraphUpdate(edge_insert_src=[1, 2], edge_insert_dst=[3], vertex_insert_ids=[5], vertex_insert_x=[[1, 2]] * 2)
    assert "edge_insert_dst has 1 rows, edge_insert_src has 2" in str(err.value)
    assert "vertex_insert_x has shape (2, 2), expected (1, F)" in str(err.value)


# --- apply ------------------------------------------------------------------------------------------


def test_every_kind_applied():
    before = graph()
    applied = apply(every_kind(), before)
    after = applied.graph
    np.testing.assert_array_equal(after.ids, [10, 20, 40, 50, 60, 70])
    np.testing.assert_array_equal(after.x, [[1, 0], [2, 0], [9, 9], [5, 0], [6, 6], [7, 7]])
    assert after.x.dtype == np.float32
    np.testing.assert_array_equal(after.edge_src, [0, 3, 0, 4, 5, 2])
    np.testing.assert_array_equal(after.edge_dst, [1, 0, 1, 0, 2, 3])
    assert edges(after) == [
        (10, 20, 1.0),
        (50, 10, 2.0),
        (10, 20, 1.0),
        (60, 10, 0.5),
        (70, 40, 1.5),
        (40, 50, 4.0),
    ]
    np.testing.assert_array_equal(after.y, [0, 1, 2, 1, -1, -1])
    assert after.split.tolist() == ["train", "val", "test", "train", "", ""]
    assert after.name == "tiny"
    np.testing.assert_array_equal(applied.old_rows, [0, 1, 3, 4, -1, -1])
    np.testing.assert_array_equal(applied.new_rows, [0, 1, -1, 2, 3])
    np.testing.assert_array_equal(applied.removed_edges, [1, 2, 3, 4])  # 30's two edges, 10->20 (w3), 40->50
    np.testing.assert_array_equal(applied.kept_edges, [0, 5, 6])
    np.testing.assert_array_equal(applied.inserted_edges, [3, 4, 5])
    np.testing.assert_array_equal(applied.feature_changed, [2, 4, 5])  # 40 updated, 60 and 70 inserted; not 10
    for name in ("old_rows", "new_rows", "removed_edges", "kept_edges", "inserted_edges", "feature_changed"):
        assert getattr(applied, name).dtype == np.int64, name
    assert after.validate() is after
    assert edges(before) == edges(graph()) and np.array_equal(before.x, graph().x)  # the input is untouched


def test_unweighted_graph_without_labels():
    before = GraphData.from_edge_ids([1, 2, 3], np.eye(3), [1, 2], [2, 3])
    update = GraphUpdate(vertex_insert_ids=[4], vertex_insert_x=[[0, 0, 1]], edge_insert_src=[4], edge_insert_dst=[1])
    after = apply(update, before).graph
    assert edges(after) == [(1, 2, None), (2, 3, None), (4, 1, None)]
    assert after.weight is None and after.y is None and after.split is None


@pytest.mark.parametrize(
    "weights, removed",
    [
        ([NAN], [0]),  # one row removes ONE occurrence: the first in edge order
        ([NAN, NAN], [0, 2]),
        ([NAN, NAN, NAN], [0, 2, 6]),
        ([3.0], [2]),  # a weight picks an occurrence of exactly that weight
        ([1.0, 1.0], [0, 6]),
        ([NAN, 1.0], [0, 2]),  # weighted deletes are matched first; the unweighted one takes the first left
        ([3.0, NAN, NAN], [0, 2, 6]),
    ],
)
def test_multigraph_deletes_remove_one_occurrence_per_row(weights, removed):
    update = GraphUpdate(
        edge_delete_src=[10] * len(weights), edge_delete_dst=[20] * len(weights), edge_delete_weight=weights
    )
    applied = apply(update, graph())
    np.testing.assert_array_equal(applied.removed_edges, removed)
    remaining = Counter(edges(graph())) - Counter(edges(graph())[i] for i in removed)
    assert Counter(edges(applied.graph)) == remaining


def test_delete_and_reinsert_the_same_edge():
    """Deletes apply before inserts: an edge can be replaced in one update (here without a weight)."""
    before = GraphData.from_edge_ids([1, 2, 3], np.eye(3), [1, 2, 1], [2, 3, 2])
    update = GraphUpdate(edge_delete_src=[1, 1], edge_delete_dst=[2, 2], edge_insert_src=[1], edge_insert_dst=[2])
    applied = apply(update, before)
    assert edges(applied.graph) == [(2, 3, None), (1, 2, None)]
    np.testing.assert_array_equal(applied.removed_edges, [0, 2])
    np.testing.assert_array_equal(applied.inserted_edges, [1])


def test_vertex_delete_removes_incident_edges():
    applied = apply(GraphUpdate(vertex_delete_ids=[10]), graph())
    np.testing.assert_array_equal(applied.removed_edges, [0, 2, 5, 6])
    np.testing.assert_array_equal(applied.kept_edges, [1, 3, 4])
    assert edges(applied.graph) == [(20, 30, 2.0), (30, 40, 1.0), (40, 50, 1.0)]
    np.testing.assert_array_equal(applied.new_rows, [-1, 0, 1, 2, 3])
    np.testing.assert_array_equal(applied.graph.y, [1, -1, 2, 1])


# --- validation -------------------------------------------------------------------------------------


def test_vertex_problems_name_the_ids():
    update = GraphUpdate(
        vertex_delete_ids=[30, 30, 99],
        vertex_insert_ids=[20, 30, 60, 60, 61],
        vertex_insert_x=[[1, 1], [1, 1], [1, 1], [1, 1], [NAN, 1]],
        feature_update_ids=[30, 77, 40, 40, 61],
        feature_update_x=np.ones((5, 3)),
    )
    text = failure(update, graph())
    assert "update of graph 'tiny' failed validation (10 problems)" in text
    assert "vertex_delete: 1 ids are not vertices of the graph; first: 99" in text
    assert "vertex_delete: 1 ids appear more than once; first: 30 (x2)" in text
    assert "vertex_insert: 1 ids are already vertices of the graph; first: 20" in text
    assert "vertex_insert: 1 ids are deleted by this update (a vertex cannot be deleted and re-inserted" in text
    assert "vertex_insert: 1 ids appear more than once; first: 60 (x2)" in text
    assert "vertex_insert: 1 rows have NaN/Inf feature values; first ids: 61" in text
    assert (
        "feature_update: 2 ids are not vertices of the graph (an inserted vertex takes its x from its vertex_insert "
        in text
    )
    assert "row); first: 61, 77" in text
    assert "feature_update: 1 ids are deleted by this update; first: 30" in text
    assert "feature_update: 1 ids appear more than once; first: 40 (x2)" in text
    assert (
        "feature_update: 5 rows have x of width 3, the graph's features have width 2; first ids: 30, 40, 40, 61, 77"
        in text
    )


def test_feature_update_nan_is_refused():
    text = failure(GraphUpdate(feature_update_ids=[20], feature_update_x=[[np.inf, 0]]), graph())
    assert "feature_update: 1 rows have NaN/Inf feature values; first ids: 20" in text


def test_edge_insert_problems():
    update = GraphUpdate(
        vertex_delete_ids=[50],
        edge_insert_src=[10, 99, 10, 20, 20],
        edge_insert_dst=[50, 10, 20, 30, 40],
        edge_insert_weight=[1.0, 1.0, NAN, -1.0, np.inf],
    )
    text = failure(update, graph())
    assert (
        "edge_insert: 1 edges have an endpoint that is neither a vertex of the graph nor inserted by this update; "
        in (text)
    )
    assert "first: (99 -> 10)" in text
    assert "edge_insert: 1 edges have an endpoint deleted by this update; first: (10 -> 50)" in text
    assert "edge_insert: 1 edges have no weight, but the graph has edge weights; first: (10 -> 20)" in text
    assert (
        "edge_insert: 2 edges have a negative, NaN or Inf weight; first: (20 -> 30, weight=-1), (20 -> 40, weight=inf)"
    ) in text
    missing = failure(GraphUpdate(edge_insert_src=[10], edge_insert_dst=[20]), graph())
    assert "edge_insert: 1 edges have no weight, but the graph has edge weights; first: (10 -> 20)" in missing


def test_weight_on_an_unweighted_graph():
    inserts = {"edge_insert_src": [10, 20], "edge_insert_dst": [20, 30], "edge_insert_weight": [NAN, 2.0]}
    update = GraphUpdate(**inserts, edge_delete_src=[10], edge_delete_dst=[20], edge_delete_weight=[1.0])
    text = failure(update, graph(weighted=False))
    assert "edge_insert: 1 edges have a weight, but the graph has no edge weights; first: (20 -> 30, weight=2)" in text
    assert "edge_delete: 1 edges have a weight, but the graph has no edge weights; first: (10 -> 20, weight=1)" in text


def test_edge_delete_problems():
    update = GraphUpdate(
        vertex_delete_ids=[30],
        edge_delete_src=[10, 10, 10, 10, 20, 99, 40],
        edge_delete_dst=[20, 20, 20, 20, 30, 10, 50],
        edge_delete_weight=[NAN, NAN, NAN, NAN, NAN, NAN, 2.0],
    )
    text = failure(update, graph())
    assert "edge_delete: 1 edges have an endpoint that is not a vertex of the graph; first: (99 -> 10)" in text
    assert (
        "edge_delete: 1 edges have an endpoint deleted by this update (deleting a vertex already removes its edges); "
        "first: (20 -> 30)"
    ) in text
    assert (
        "edge_delete: 2 edges are deleted more times than the graph holds them; "
        "first: (10 -> 20) deleted 4x, present 3x, (40 -> 50, weight=2) deleted 1x, present 0x"
    ) in text


def test_weighted_and_unweighted_deletes_count_together():
    update = GraphUpdate(edge_delete_src=[10] * 4, edge_delete_dst=[20] * 4, edge_delete_weight=[3.0, NAN, NAN, NAN])
    assert "first: (10 -> 20) deleted 4x, present 3x" in failure(update, graph())
    too_many_of_weight = GraphUpdate(edge_delete_src=[10] * 2, edge_delete_dst=[20] * 2, edge_delete_weight=[3.0] * 2)
    assert "first: (10 -> 20, weight=3) deleted 2x, present 1x" in failure(too_many_of_weight, graph())


def test_failed_update_leaves_the_graph_unchanged():
    before = graph()
    arrays = ("ids", "x", "edge_src", "edge_dst", "weight", "y", "split")
    copies = {name: getattr(before, name).copy() for name in arrays}
    bad = every_kind()
    bad.edge_delete_weight[0] = 7.0  # no (10 -> 20) of weight 7: nothing of the rest may be applied
    with pytest.raises(GraphUpdateError, match=r"\(10 -> 20, weight=7\) deleted 1x, present 0x"):
        apply(bad, before)
    for name in arrays:
        np.testing.assert_array_equal(copies[name], getattr(before, name), err_msg=name)


def test_many_offenders_are_counted_and_truncated():
    update = GraphUpdate(vertex_delete_ids=np.arange(1000, 1050))
    text = failure(update, graph())
    assert "vertex_delete: 50 ids are not vertices of the graph; first: 1000, 1001, 1002, 1003, 1004, ..." in text
    assert "(an inserted vertex" not in failure(GraphUpdate(feature_update_ids=[5], feature_update_x=[[1, 1]]), graph())


# --- vectorised apply equals a slow reference ---------------------------------------------------------


def reference_apply(update: GraphUpdate, data: GraphData):
    """The rules, one row at a time: (ids, {id: x}, [(src, dst, weight)] in new-graph order)."""
    deleted = set(update.vertex_delete_ids.tolist())
    ids = [i for i in data.ids.tolist() if i not in deleted] + update.vertex_insert_ids.tolist()
    x = {i: row for i, row in zip(data.ids.tolist(), data.x.tolist(), strict=True) if i not in deleted}
    x.update(zip(update.vertex_insert_ids.tolist(), update.vertex_insert_x.tolist(), strict=True))
    x.update(zip(update.feature_update_ids.tolist(), update.feature_update_x.tolist(), strict=True))
    old = list(zip(data.src_ids.tolist(), data.dst_ids.tolist(), data.weight.tolist(), strict=True))
    removed = [s in deleted or d in deleted for s, d, _ in old]
    positions = defaultdict(list)
    for position, (s, d, _) in enumerate(old):
        positions[(s, d)].append(position)
    deletes = list(
        zip(update.edge_delete_src.tolist(), update.edge_delete_dst.tolist(), update.edge_delete_weight, strict=True)
    )
    for with_weight in (True, False):  # deletes with a weight are matched first
        for s, d, w in deletes:
            if np.isnan(w) == with_weight:
                continue
            position = next(p for p in positions[(s, d)] if not removed[p] and (np.isnan(w) or old[p][2] == w))
            removed[position] = True
    inserted = zip(
        update.edge_insert_src.tolist(), update.edge_insert_dst.tolist(), update.edge_insert_weight, strict=True
    )
    new_edges = [e for e, gone in zip(old, removed, strict=True) if not gone] + [
        (s, d, float(w)) for s, d, w in inserted
    ]
    return ids, x, new_edges


def random_case(seed: int):
    rng = np.random.default_rng(seed)
    n, e, f = 20_000, 180_000, 4
    ids = rng.permutation(5 * n)[:n]
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    parallel = rng.integers(0, e, 20_000)  # 20K parallel copies, weights from a small set: matches happen
    src, dst = np.concatenate([src, src[parallel]]), np.concatenate([dst, dst[parallel]])
    weight = rng.integers(1, 4, len(src)).astype(np.float32)
    data = GraphData(ids, rng.standard_normal((n, f)), src, dst, weight=weight, y=rng.integers(-1, 3, n), name="r")

    rows = rng.permutation(n)
    deleted = np.zeros(n, bool)
    deleted[rows[:1000]] = True
    fresh = np.setdiff1d(np.arange(5 * n), ids)[rng.permutation(4 * n)[:3000]]
    alive = np.concatenate([ids[~deleted], fresh])
    # Both copies of 3000 parallel pairs (so one (src, dst) is deleted several times, with and
    # without weights) plus random edges; distinct positions, so the deletes always fit.
    copied = rng.choice(len(parallel), 3000, replace=False)
    chosen = np.unique(np.concatenate([parallel[copied], e + copied, rng.integers(0, len(src), 4000)]))
    chosen = rng.permutation(chosen[~deleted[src[chosen]] & ~deleted[dst[chosen]]])[:6500]
    update = GraphUpdate(
        vertex_delete_ids=ids[rows[:1000]],
        vertex_insert_ids=fresh,
        vertex_insert_x=rng.standard_normal((3000, f)),
        feature_update_ids=ids[rows[1000:4000]],
        feature_update_x=rng.standard_normal((3000, f)),
        edge_delete_src=ids[src[chosen]],
        edge_delete_dst=ids[dst[chosen]],
        edge_delete_weight=np.where(rng.random(len(chosen)) < 0.5, weight[chosen], NAN),
        edge_insert_src=rng.choice(alive, 6500),
        edge_insert_dst=rng.choice(alive, 6500),
        edge_insert_weight=rng.integers(1, 4, 6500),
    )
    return data, update


def test_vectorised_apply_equals_the_reference():
    data, update = random_case(11)
    assert sum(update.counts().values()) == 20_000 and data.num_edges == 200_000
    applied = apply(update, data)
    ids, x, new_edges = reference_apply(update, data)
    after = applied.graph
    assert after.ids.tolist() == ids
    np.testing.assert_array_equal(after.x, np.array([x[i] for i in ids], np.float32))
    assert Counter(edges(after)) == Counter(new_edges)
    assert edges(after) == new_edges  # and in the documented order
    # The mappings agree with the arrays they describe.
    np.testing.assert_array_equal(after.ids[applied.new_rows[applied.new_rows >= 0]], data.ids[applied.new_rows >= 0])
    np.testing.assert_array_equal(data.ids[applied.old_rows[applied.old_rows >= 0]], after.ids[applied.old_rows >= 0])
    np.testing.assert_array_equal(
        np.sort(np.concatenate([applied.kept_edges, applied.removed_edges])), np.arange(200_000)
    )
    np.testing.assert_array_equal(after.weight[: len(applied.kept_edges)], data.weight[applied.kept_edges])
    np.testing.assert_array_equal(after.weight[applied.inserted_edges], update.edge_insert_weight)
    assert len(applied.feature_changed) == 6000  # 3000 updates (random, so all differ) + 3000 inserts
    assert (after.y[applied.old_rows < 0] == -1).all()
    after.validate()


def test_edge_inserts_carry_edge_attributes_through_the_table_and_apply():
    import dataclasses

    attr = np.arange(14, dtype=np.float32).reshape(7, 2)
    data = dataclasses.replace(graph(), edge_attr=attr)
    update = GraphUpdate(
        edge_insert_src=[20, 10],
        edge_insert_dst=[50, 50],
        edge_insert_weight=[1.0, 2.0],
        edge_insert_attr=[[0.5, 1.5], [2.5, 3.5]],
        edge_delete_src=[20],
        edge_delete_dst=[30],
        vertex_delete_ids=[40],
    )
    again = GraphUpdate.from_table(update.to_table())
    np.testing.assert_array_equal(again.edge_insert_attr, update.edge_insert_attr)
    assert "edge_attr" not in GraphUpdate(edge_insert_src=[20], edge_insert_dst=[40]).to_table().column_names
    after = apply(again, data).graph
    kept = [0, 2, 5, 6]  # 20->30 deleted, 30->40 and 40->50 touch the deleted 40
    np.testing.assert_array_equal(after.edge_attr, np.concatenate([attr[kept], update.edge_insert_attr]))
    missing = failure(dataclasses.replace(update, edge_insert_attr=None), data)
    assert "edge_insert: 2 edges have no edge_attr, but the graph's edges carry attributes of width 2" in missing
    wide = failure(dataclasses.replace(update, edge_insert_attr=np.ones((2, 3))), data)
    assert "edge_insert: 2 edges have an edge_attr of width 3, the graph's have width 2" in wide
    nan = failure(dataclasses.replace(update, edge_insert_attr=[[0.0, NAN], [1.0, 1.0]]), data)
    assert "edge_insert: 1 edges have NaN/Inf edge_attr values; first: (20 -> 50)" in nan
    assert "edges have an edge_attr, but the graph's edges carry none" in failure(update, graph())
    one = table([{"kind": "edge_insert", "src": 20, "dst": 40, "weight": 1.0}]).append_column(
        "edge_attr", pa.array([[1.0, 2.0]], pa.list_(pa.float32()))
    )
    assert GraphUpdate.from_table(one).edge_insert_attr.shape == (1, 2)
    two = pa.concat_tables([one, one.set_column(6, "edge_attr", pa.array([None], pa.list_(pa.float32())))])
    with pytest.raises(GraphUpdateError, match="edge_insert: 1 edges have a null edge_attr vector"):
        GraphUpdate.from_table(two)


def test_an_update_keeping_every_vertex_shares_the_vertex_arrays():
    """No vertex in or out: the new graph shares ids, x (copied only when features change) and
    the id index with the old one, and the old graph is left as it was."""
    g = graph()
    g.id_index  # noqa: B018 - built, so it is shared
    x_before = g.x.copy()
    edge_only = apply(
        GraphUpdate(edge_insert_src=g.ids[[0]], edge_insert_dst=g.ids[[1]], edge_insert_weight=np.ones(1, np.float32)),
        g,
    )
    new = edge_only.graph
    assert new.ids is g.ids and new.x is g.x and new.__dict__["id_index"] is g.id_index
    assert new.num_edges == g.num_edges + 1
    features = apply(
        GraphUpdate(feature_update_ids=g.ids[[2]], feature_update_x=np.full((1, g.feature_dim), 9, np.float32)), g
    )
    assert features.graph.x is not g.x and np.array_equal(g.x, x_before)
    assert np.all(features.graph.x[2] == 9) and list(features.feature_changed) == [2]


def test_edge_inserts_append_in_place_and_leave_every_earlier_graph_as_it_was():
    """A line of edge-insert updates writes each one's edges after the last graph's (no copy of
    the edge arrays); applying another update to an earlier graph of the line copies instead, so
    no graph's edges ever change under it."""
    g = graph()

    def insert(data, src, dst, w):
        one = np.ones(1, np.float32) * w
        return apply(GraphUpdate(edge_insert_src=[src], edge_insert_dst=[dst], edge_insert_weight=one), data)

    first = insert(g, 10, 30, 5.0)
    assert list(first.kept_edges) == list(range(g.num_edges)) and len(first.removed_edges) == 0
    g1 = first.graph
    g2 = insert(g1, 20, 40, 6.0).graph
    assert g2.edge_src.base is g1.edge_src.base and g2.weight.base is g1.weight.base  # appended in place
    branch = insert(g1, 50, 30, 7.0).graph
    assert branch.edge_src.base is not g1.edge_src.base
    assert edges(g1)[:-1] == edges(g) and edges(g1)[-1] == (10, 30, 5.0)
    assert edges(g2)[-1][:2] == (20, 40) and edges(branch)[-1][:2] == (50, 30)
    assert edges(g2)[:-1] == edges(g1) and edges(branch)[:-1] == edges(g1)
    assert g2.weight[-1] == 6.0 and branch.weight[-1] == 7.0 and g1.weight[-1] == 5.0
