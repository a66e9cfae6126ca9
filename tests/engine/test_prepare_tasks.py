"""Prepare's layouts written by the Python tasks (engine.prepare_tasks) equal the Spark SQL ones,
row for row and statistic for statistic, combine's on-demand layouts included; the out-edge
statistics are written on demand, by either writer, only for runs that read them."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.engine.degrees import PREPARED_STATS
from sparkgnn.engine.prepare import ensure_layouts, prepare
from sparkgnn.graph import Graph

SORT_KEYS = {
    "vertices": ["id"],
    "in_edges": ["src", "dst", "w"],
    "out_targets": ["id", "pt"],
    "out_edges": ["src", "dst", "w"],
    "in_targets": ["id", "pt"],
}


def _slice(prep_dir, layout, part):
    directory = os.path.join(prep_dir, layout, f"part={part}")
    if not os.path.isdir(directory):
        return None
    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))
    table = pa.concat_tables([pq.read_table(os.path.join(directory, f)) for f in files])
    return table.sort_by([(k, "ascending") for k in SORT_KEYS[layout]])


@pytest.mark.parametrize(("graph_name", "partitions"), [("skewed", 3), ("cora", 8), ("skewed", 1)])
def test_tasks_write_the_layouts_spark_writes(spark, graph_dirs, tmp_path, graph_name, partitions):
    path, _ = graph_dirs[graph_name]
    graph = Graph.load(spark, path)
    by_spark = prepare(spark, graph, partitions, str(tmp_path / "spark"), writer="spark")
    by_tasks = prepare(spark, graph, partitions, str(tmp_path / "tasks"), writer="tasks")
    assert by_tasks.stats == by_spark.stats
    by_spark = ensure_layouts(spark, graph, by_spark, ["combine"], writer="spark")
    by_tasks = ensure_layouts(spark, graph, by_tasks, ["combine"], writer="tasks")
    for layout in SORT_KEYS:
        for part in range(partitions):
            expected, actual = _slice(by_spark.path, layout, part), _slice(by_tasks.path, layout, part)
            if expected is None:
                assert actual is None, (layout, part)
                continue
            assert actual.column_names == expected.column_names
            for column in expected.column_names:
                a, e = actual.column(column).to_numpy(), expected.column(column).to_numpy()
                assert a.dtype == e.dtype, (layout, column)
                if column in PREPARED_STATS:  # float sums, added in another order
                    np.testing.assert_allclose(a, e, rtol=1e-6)
                else:
                    np.testing.assert_array_equal(a, e, err_msg=f"{layout} part {part} column {column}")


def test_a_rerun_after_an_interrupted_preparation_replaces_its_files(spark, graph_dirs, tmp_path):
    from sparkgnn.engine.phases import PhaseClock, activate

    path, _ = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    with activate(PhaseClock()) as clock:
        first = prepare(spark, graph, 3, str(tmp_path / "work"), writer="tasks")
        os.remove(os.path.join(first.path, "prepared.json"))  # as if the job died before the marker
        again = prepare(spark, graph, 3, str(tmp_path / "work"), writer="tasks")
    assert again.stats == first.stats and not again.reused
    # each preparation's two Spark jobs are lines of the job's time table
    calls = {row["name"]: row["calls"] for row in clock.summary()["phases"]}
    assert calls == {"prepare: edges by partition (tasks)": 2, "prepare: vertices, mirrors and counts (tasks)": 2}
    files = [f for root, _, names in os.walk(os.path.join(again.path, "in_edges")) for f in names]
    assert len({f.split("-")[1] for f in files}) == 1  # one preparation's files only


def test_a_layout_of_an_older_version_is_prepared_again_not_reused(spark, graph_dirs, tmp_path):
    from sparkgnn import files
    from sparkgnn.engine.prepare import LAYOUT_VERSION, MARKER, is_prepared

    path, _ = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    work = str(tmp_path / "work")
    first = prepare(spark, graph, 2, work, writer="tasks")
    marker = os.path.join(first.path, MARKER)
    older = files.read_json(marker)
    assert older.pop("layout") == LAYOUT_VERSION
    files.write_json_atomic(marker, older)  # as an earlier version wrote it (vertices without some statistics)
    assert not is_prepared(graph, 2, work)
    again = prepare(spark, graph, 2, work, writer="tasks")
    assert not again.reused and again.stats == first.stats
    assert files.read_json(marker)["layout"] == LAYOUT_VERSION and is_prepared(graph, 2, work)
    assert prepare(spark, graph, 2, work, writer="tasks").reused
    assert set(PREPARED_STATS) <= set(_slice(again.path, "vertices", 0).column_names)


@pytest.mark.parametrize("writer", ["spark", "tasks"])
def test_out_edge_statistics_are_computed_on_demand_once_never_by_prepare(spark, graph_dirs, tmp_path, writer):
    """A prepare writes no out-edge statistic (no column, no piece); ensure_out_stats writes the
    asked ones from the prepared layout without preparing it again, equal to the arrays per owned
    vertex, and a second call reuses them."""
    from sparkgnn import files
    from sparkgnn.engine import static
    from sparkgnn.engine.degrees import OUT_STATS, stat_values
    from sparkgnn.engine.prepare import MARKER, ensure_out_stats, out_stat_marker

    path, data = graph_dirs["skewed"]
    prepared = prepare(spark, Graph.load(spark, path), 3, str(tmp_path / "work"), writer=writer)
    assert not set(OUT_STATS) & set(_slice(prepared.path, "vertices", 0).column_names)
    assert not os.path.exists(os.path.join(prepared.path, static.OUT_STATS_DIR))
    assert ensure_out_stats(spark, prepared, PREPARED_STATS, writer=writer) is prepared  # nothing to write
    marker = files.read_json(os.path.join(prepared.path, MARKER))
    ensured = ensure_out_stats(spark, prepared, ["gcn_degree", *OUT_STATS], writer=writer)
    assert not ensured.reused and files.read_json(os.path.join(prepared.path, MARKER)) == marker
    src, dst, w = np.asarray(data.src_ids), np.asarray(data.dst_ids), np.asarray(data.weight)
    for part in range(3):
        ids = static.owned(prepared.path, part).ids
        actual = static.stat_columns(prepared.path, part, OUT_STATS)
        for key in OUT_STATS:
            np.testing.assert_allclose(actual[key], stat_values(key, ids, src, dst, w), rtol=1e-6, err_msg=key)
    assert all(os.path.exists(out_stat_marker(prepared.path, key)) for key in OUT_STATS)
    assert ensure_out_stats(spark, ensured, OUT_STATS, writer=writer) is ensured  # written once, reused


def test_a_chebconv_run_after_a_plain_prepare_adds_its_statistic_without_preparing_again(spark, graph_dirs, tmp_path):
    import torch
    from engine_helpers import relative_error, spark_output
    from torch_geometric.nn import ChebConv, Sequential

    from sparkgnn import files, infer
    from sparkgnn.engine.prepare import MARKER, out_stat_marker
    from sparkgnn.models import Model

    path, data = graph_dirs["skewed"]
    work = str(tmp_path / "work")
    prepared = prepare(spark, Graph.load(spark, path), 3, work, writer="tasks")  # what a GCN job leaves
    marker = files.read_json(os.path.join(prepared.path, MARKER))
    torch.manual_seed(5)
    module = Sequential(
        "x, edge_index, edge_weight", [(ChebConv(data.feature_dim, 4, K=2), "x, edge_index, edge_weight -> x")]
    )
    result = infer(spark, path, Model.from_pyg(module.eval()), partitions=3, work_dir=work, exchange="files")
    assert result.report.prepare_reused is False  # the piece was written ...
    assert files.read_json(os.path.join(prepared.path, MARKER)) == marker  # ... the layout not prepared again
    assert os.path.exists(out_stat_marker(prepared.path, "laplacian_degree_w"))
    assert not os.path.exists(out_stat_marker(prepared.path, "laplacian_degree"))
    with torch.no_grad():
        expected = module(torch.from_numpy(data.x), data.edge_index_torch(), torch.from_numpy(data.weight)).numpy()
    assert relative_error(spark_output(result.frame, data), expected) <= 1e-5


def _unvouched_copy(source: str, target) -> str:
    """The graph's data files without graph.json: a directory another tool wrote."""
    import shutil

    for folder in ("vertices", "edges"):
        shutil.copytree(os.path.join(source, folder), target / folder)
    return str(target)


def test_an_unvouched_graph_is_validated_and_fingerprinted_in_prepares_own_two_jobs(spark, graph_dirs, tmp_path):
    from sparkgnn import files
    from sparkgnn.graph import facts_cache

    source, data = graph_dirs["skewed"]
    vouched = Graph.load(spark, source)
    path = _unvouched_copy(source, tmp_path / "g")
    graph = Graph.load(spark, path, validate=False)
    assert graph.unvouched and graph.sizes() == {"num_vertices": data.num_nodes, "num_edges": data.num_edges}
    work = str(tmp_path / "work")
    context = spark.sparkContext
    context.setJobGroup("scan", "scan")
    try:
        prepared = prepare(spark, graph, 3, work, writer="tasks")
        jobs = len(context.statusTracker().getJobIdsForGroup("scan"))
    finally:
        context.setJobGroup("", "")
    assert jobs == 2  # the two passes: no validation or fingerprint job of their own
    assert graph.known_fingerprint == vouched.fingerprint and not graph.unvouched
    assert prepared.path == files.join(work, "prep", vouched.fingerprint, "P=3") and not prepared.reused
    assert {k: graph.stats()[k] for k in facts_cache.COUNT_KEYS} == {
        k: vouched.stats()[k] for k in facts_cache.COUNT_KEYS
    }
    assert prepared.stats == prepare(spark, vouched, 3, str(tmp_path / "other"), writer="tasks").stats
    assert sorted(os.listdir(os.path.join(work, "prep"))) == [vouched.fingerprint]  # the scan's folder renamed
    assert facts_cache.recall(work, path, graph.data_stamp)["fingerprint"] == vouched.fingerprint


def test_an_unvouched_graph_with_a_dangling_edge_is_refused_as_validation_words_it(spark, graph_dirs, tmp_path):
    from sparkgnn.errors import GraphValidationError

    source, data = graph_dirs["skewed"]
    path = _unvouched_copy(source, tmp_path / "g")
    extra = {"src": pa.array([int(data.ids[0])]), "dst": pa.array([-5]), "weight": pa.array([1.0], pa.float32())}
    pq.write_table(pa.table(extra), os.path.join(path, "edges", "zz-extra.parquet"))
    with pytest.raises(GraphValidationError) as expected:
        Graph.load(spark, path, validate=False).validate()
    from torch_geometric.nn import SAGEConv

    from sparkgnn import infer
    from sparkgnn.models import Model

    work, out = tmp_path / "work", tmp_path / "out"
    model = Model.from_pyg(SAGEConv(data.feature_dim, 4).eval())
    with pytest.raises(GraphValidationError) as refused:  # validation deferred to prepare's tasks
        infer(spark, path, model, out=str(out), partitions=3, work_dir=str(work), exchange="files")
    assert str(refused.value) == str(expected.value)
    assert "1 edges have a dst that is not a vertex id" in str(refused.value) and "-5" in str(refused.value)
    assert not out.exists() and not any((work / "prep").glob(".scan-*"))  # nothing written, the scan folder gone


def test_a_typed_rounds_relation_layouts_in_one_pass_equal_the_spark_sql_prepare_of_each(spark, tmp_path):
    """Typed relation graphs (engine.typed_relations: ids mapped to 2*id / 2*id+1 between two
    types) prepared together from their own folders (prepare.prepare_many, two Spark jobs)
    equal each one's Spark SQL prepare; an id that the mapping cannot hold is refused naming its type."""
    import sys

    from sparkgnn.engine.phases import PhaseClock, activate
    from sparkgnn.engine.prepare import prepare_many
    from sparkgnn.engine.prepare_tasks import IdMap
    from sparkgnn.engine.typed_relations import relation_fingerprint, relation_graph, relation_row_files
    from sparkgnn.errors import SparkGNNError
    from sparkgnn.graph import write_typed_graph_dir
    from sparkgnn.graph.typed_spark import TypedGraph

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
    from typed_testkit import pyg_data, typed_graph

    path = str(tmp_path / "typed")
    write_typed_graph_dir(typed_graph(pyg_data()), path)
    typed = TypedGraph.load(spark, path)
    values = {t: frame.selectExpr("id", "x AS h") for t, frame in typed.vertices.items()}
    cross = next(et for et in typed.edges if et[0] != et[2])
    within = next(et for et in typed.edges if et[0] == et[2])

    def graphs(with_files: bool):
        return [
            relation_graph(
                values,
                typed.edges[et],
                et,
                4,
                typed.name,
                fingerprint=relation_fingerprint(typed.fingerprint, et),
                row_files=relation_row_files(typed, et) if with_files else None,
            )
            for et in (cross, within)
        ]

    with activate(PhaseClock()) as clock:
        assert prepare_many(spark, [(g, 3) for g in graphs(True)], str(tmp_path / "tasks")) == 2
    calls = {row["name"]: row["calls"] for row in clock.summary()["phases"]}
    assert calls == {"prepare: edges by partition (tasks)": 1, "prepare: vertices, mirrors and counts (tasks)": 1}
    for by_files, by_rows in zip(graphs(True), graphs(False), strict=True):
        by_tasks = prepare(spark, by_files, 3, str(tmp_path / "tasks"), writer="tasks")
        by_spark = prepare(spark, by_rows, 3, str(tmp_path / "spark"), writer="spark")
        assert by_tasks.reused and by_tasks.stats == by_spark.stats
        for layout in ("vertices", "in_edges", "out_targets"):
            for part in range(3):
                expected, actual = _slice(by_spark.path, layout, part), _slice(by_tasks.path, layout, part)
                if expected is None:
                    assert actual is None, (layout, part)
                    continue
                for column in expected.column_names:
                    a, e = actual.column(column).to_numpy(), expected.column(column).to_numpy()
                    np.testing.assert_allclose(a, e, rtol=1e-6, err_msg=f"{layout} part {part} column {column}")
    with pytest.raises(SparkGNNError, match="node type author: id beyond"):
        IdMap(2, 1, "author").apply(np.array([3, 1 << 62], np.int64))
    np.testing.assert_array_equal(IdMap(2, 1, "author").apply(np.array([-3, 5])), [-5, 11])
