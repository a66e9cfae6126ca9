"""Incremental PE refresh on Spark (engine/refresh): every layer of the refreshed store equals
the single-machine refresh and a from-scratch precompute of the updated graph, for GCN,
SAGE-mean, SAGE-max, GIN, GAT and JumpingKnowledge (skip connections), 2 and 3 layers, over 1
piece (no foreign vertices) and 3 (GIN in the crash test), on a weighted power-law graph with
self-loops and parallel edges, with edge inserts and deletes, vertex inserts and deletes and feature updates
(and, for GINE -> GAT(edge_dim), edge attributes on the graph and the inserted edges); a
bad update is refused with its problems named and nothing written; a refresh killed after its
first layer and rerun gives the same store."""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
from test_refresh import assert_same_store, model_of, random_update  # noqa: E402

from sparkgnn.engine.refresh import refresh  # noqa: E402
from sparkgnn.errors import GraphUpdateError  # noqa: E402
from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.graph.updates import UPDATE_SCHEMA, GraphUpdate  # noqa: E402
from sparkgnn.graph.writer import write_graph_dir  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    graph = skewed_graph()
    path = str(tmp_path_factory.mktemp("graph") / "g")
    write_graph_dir(graph, path)
    return graph, path


@pytest.fixture(scope="module")
def shared_work(tmp_path_factory):
    """One work dir for the refreshes of graph_dir's graph that do not test the pieces cache
    itself: the graph's pieces at a partition count are built by Spark in the first of them and
    read from the cache by the rest (the killed-run test keeps its own: it asserts which run built
    them). A refresh's run directory and the pieces it adopts are keyed per run and per graph."""
    return str(tmp_path_factory.mktemp("refresh-work"))


@pytest.fixture(autouse=True)
def _delta_kernel(monkeypatch):
    """The Spark refresh runs the delta / scratch kernel on every layer; the local refreshes these
    tests compare its plan with are held to the same kernel (on this small graph an update reaches
    over half the vertices, where refresh_local would compute the layer whole)."""
    from sparkgnn.pe import refresh as local_refresh

    monkeypatch.setattr(local_refresh, "WHOLE_LAYER_FRACTION", 2.0)


def _setup(graph, path, tmp_path, kind, layers, seed, metrics=False):
    model = model_of(kind, graph.feature_dim, layers)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root, metrics=metrics)
    update = random_update(graph, seed=seed)
    updates = update.write(str(tmp_path / "update"))
    return model, root, old, update, updates


@pytest.mark.parametrize(
    ("kind", "layers", "partitions"),
    [("jk_cat", 2, 3), ("sage", 3, 3), ("sage_max", 2, 1), ("gat", 2, 3)],  # GIN: the crash test; jk_cat: SAGE then GCN
)
def test_spark_refresh_equals_a_precompute_of_the_updated_graph(
    spark, graph_dir, shared_work, tmp_path, kind, layers, partitions
):
    graph, path = graph_dir
    metrics = kind == "sage_max"  # one case: a version with workload metrics keeps them, recomputed
    model, root, old, update, updates = _setup(graph, path, tmp_path, kind, layers, seed=layers, metrics=metrics)
    out = str(tmp_path / "graph2")
    result = refresh(spark, path, model, store=root, updates=updates, out_graph=out, partitions=partitions,
                     work_dir=shared_work)  # fmt: skip
    store, report = result.store, result.report
    new_graph = read_graph_dir(out)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, new_graph.ids, layers)
    local_root = str(tmp_path / "local")
    precompute_local(graph, model, local_root, metrics=metrics)
    from sparkgnn.pe.refresh import refresh_local

    local, local_report = refresh_local(graph, update, model, local_root)
    if metrics:  # recomputed on the updated graph (pe.metrics on Spark) with the old version's options
        from sparkgnn.graph import Graph
        from sparkgnn.pe.metrics import fap

        assert store.metric_tables == local.metric_tables == ["degrees", "fap", "psgs"]
        assert store.manifest["metrics"]["summary"]["hops"] == old.manifest["metrics"]["summary"]["hops"]
        got = store.metrics_table("fap").to_pandas().set_index("id")["fap"]
        want = fap(Graph.load(spark, out), old.manifest["metrics"]["summary"]["hops"]).toPandas().set_index("id")["fap"]
        np.testing.assert_allclose(got.sort_index().to_numpy(), want.sort_index().to_numpy(), rtol=1e-12)
        assert sorted(got.index) == sorted(new_graph.ids)
    assert report.graph_fingerprint == local_report.graph_fingerprint == scratch.manifest["graph_fingerprint"]
    assert [s["targets"] for s in report.layers] == [s["targets"] for s in local_report.layers]
    assert report.updates == local_report.updates == update.counts()  # counted by the tasks
    assert {s["values"] for s in report.layers} == {"read from row files"}  # a local precompute's store
    assert store.manifest["refresh"]["chain"] == [old.manifest["graph_fingerprint"], report.graph_fingerprint]
    assert report.layers[0]["targets"] < new_graph.num_nodes
    # the same commits as the local refresh: a delta, or whole where the change reaches half the layer
    assert [s["committed"].split()[0] for s in report.layers] == [
        s["committed"].split()[0] for s in local_report.layers
    ]
    assert any("delta" in s["committed"] for s in report.layers)
    assert os.listdir(os.path.join(shared_work, "refresh")) == []  # the run directory is gone
    np.testing.assert_array_equal(PEStore.open(root, model=model, graph=path).lookup(graph.ids, 1)[0],
                                  old.lookup(graph.ids, 1)[0])  # fmt: skip


def test_a_bad_update_is_refused_with_its_problems_and_nothing_written(spark, graph_dir, shared_work, tmp_path):
    import pyarrow as pa

    graph, path = graph_dir
    model = model_of("gcn", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    d = graph.feature_dim
    rows = [
        ("edge_insert", int(graph.ids[0]), 10**12, 1.0, None, None),  # unknown destination
        ("edge_insert", 10**12 + 1, int(graph.ids[1]), 1.0, None, None),  # unknown source
        ("feature_update", None, None, None, int(graph.ids[2]), [float("nan")] * d),
        ("vertex_insert", None, None, None, int(graph.ids[3]), [0.0] * d),  # exists
        ("edge_delete", int(graph.ids[0]), int(graph.ids[0]), 123.0, None, None),  # no such edge
    ]
    columns = list(zip(*rows, strict=True))
    table = pa.table({f.name: pa.array(list(c), f.type) for f, c in zip(UPDATE_SCHEMA, columns, strict=True)})
    updates = GraphUpdate.from_table(table).write(str(tmp_path / "bad"))
    before = sorted(os.listdir(root))
    with pytest.raises(GraphUpdateError) as caught:
        refresh(spark, path, model, store=root, updates=updates, partitions=3, work_dir=shared_work)
    text = str(caught.value)
    for needle in (str(10**12), str(10**12 + 1), "NaN", str(graph.ids[3])):
        assert needle in text, (needle, text)
    assert sorted(os.listdir(root)) == before
    # rows without the id they are routed by (an edge's dst, a vertex row's node) reach a task that
    # names them (a vertex row without its node used to join no piece: dropped, not refused)
    import pyarrow.parquet as pq

    rows = [("edge_insert", int(graph.ids[4]), None, 1.0, None, None), ("vertex_delete", None, None, None, None, None)]
    columns = list(zip(*rows, strict=True))
    unroutable = tmp_path / "unroutable"
    unroutable.mkdir()
    pq.write_table(
        pa.table({f.name: pa.array(list(c), f.type) for f, c in zip(UPDATE_SCHEMA, columns, strict=True)}),
        unroutable / "part-0.parquet",
    )
    with pytest.raises(GraphUpdateError) as caught:
        refresh(spark, path, model, store=root, updates=str(unroutable), partitions=3, work_dir=shared_work)
    assert "null dst" in str(caught.value) and "null node" in str(caught.value), str(caught.value)
    assert sorted(os.listdir(root)) == before


def test_an_update_path_the_tasks_cannot_read_is_refused_on_the_driver(tmp_path):
    """check_update, before any Spark job: what every round-0 task would fail on, named once."""
    from sparkgnn.engine.refresh.job import check_update

    with pytest.raises(GraphUpdateError, match="does not exist"):
        check_update(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(GraphUpdateError, match="holds no data files"):
        check_update(str(tmp_path / "empty"))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "rows.csv").write_text("kind,src\n")
    with pytest.raises(GraphUpdateError, match="is not a Parquet file"):
        check_update(str(tmp_path / "text"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"src": [1]}), str(tmp_path / "nokind.parquet"))
    with pytest.raises(GraphUpdateError, match="no `kind` column"):
        check_update(str(tmp_path / "nokind.parquet"))
    good = GraphUpdate(vertex_delete_ids=[1]).write(str(tmp_path / "good"))
    assert check_update(os.path.relpath(good)) == os.path.abspath(good)


def test_a_spark_refresh_killed_after_layer_one_resumes_and_the_next_refresh_reuses_its_pieces(
    spark, graph_dir, tmp_path
):
    graph, path = graph_dir
    model, root, _old, _update, updates = _setup(graph, path, tmp_path, "gin", 2, seed=11)
    out, work = str(tmp_path / "graph2"), str(tmp_path / "work")

    class Killed(RuntimeError):
        pass

    def die(layer):
        raise Killed(layer)

    with pytest.raises(Killed):
        refresh(spark, path, model, store=root, updates=updates, out_graph=out, partitions=3, work_dir=work,
                on_layer_committed=die)  # fmt: skip
    result = refresh(spark, path, model, store=root, updates=updates, out_graph=str(tmp_path / "graph3"),
                     partitions=3, work_dir=work)  # fmt: skip
    store, report = result.store, result.report
    assert [s.get("committed") for s in report.layers][0] is None  # layer 1 was committed by the first run
    assert report.phases["build_pieces"] == 0.0  # the killed run built the old graph's pieces
    new_graph = read_graph_dir(out)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, new_graph.ids, 2)

    # the next refresh starts from the pieces this one's tasks kept for the updated graph
    second = random_update(new_graph, seed=12).write(str(tmp_path / "update2"))
    final_dir = str(tmp_path / "graph4")
    with pytest.deprecated_call(match="by position"):  # the previous release's form: (PEStore, RefreshReport)
        store2, report2 = refresh(spark, out, model, root, second, out_graph=final_dir, partitions=3,
                                  work_dir=work)  # fmt: skip
    assert report2.phases["build_pieces"] == 0.0
    assert {s["values"] for s in report2.layers} == {"fetched by Spark"}  # Spark committed its layers
    final = read_graph_dir(final_dir)
    assert_same_store(store2, precompute_local(final, model, str(tmp_path / "scratch2")), final.ids, 2)


def test_edge_attributes_ride_through_the_pieces_and_a_gine_gat_refresh_equals_a_precompute(spark, tmp_path):
    """GINE (delta) then GAT with edge_dim (scratch, loops of mean attributes) over a graph whose
    edges carry attributes, with edge inserts that carry theirs: the pieces, the update rows and
    the updated graph keep them, and the store equals a precompute of the updated graph."""
    import dataclasses

    import torch
    from test_refresh import _EdgeFeatureNet

    from sparkgnn.models import Model

    rng = np.random.default_rng(7)
    base = skewed_graph()
    graph = dataclasses.replace(base, edge_attr=rng.normal(size=(base.num_edges, 3)).astype(np.float32))
    path = str(tmp_path / "g")
    write_graph_dir(graph, path)
    bare = random_update(base, seed=5)
    attr = rng.normal(size=(len(bare.edge_insert_src), 3)).astype(np.float32)
    update = dataclasses.replace(bare, edge_insert_attr=attr)
    torch.manual_seed(3)
    model = Model.from_pyg(_EdgeFeatureNet(graph.feature_dim, 3).eval())
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    out, work = str(tmp_path / "graph2"), str(tmp_path / "work")
    with pytest.raises(GraphUpdateError, match=r"edges have no edge_attr, but the graph's edges carry attributes"):
        refresh(spark, path, model, store=root, updates=bare.write(str(tmp_path / "bare")), partitions=3, work_dir=work)
    result = refresh(spark, path, model, store=root, updates=update.write(str(tmp_path / "update")), out_graph=out,
                     partitions=3, work_dir=work)  # fmt: skip
    new_graph = read_graph_dir(out)
    assert new_graph.edge_attr_dim == 3
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(result.store, scratch, new_graph.ids, 2)
    assert result.report.graph_fingerprint == scratch.manifest["graph_fingerprint"]
    assert result.report.layers[0]["delta"] > 0 and result.report.layers[1]["delta"] == 0


def test_a_chebconv_refresh_routes_the_out_degrees_summed_over_the_pieces(spark, graph_dir, shared_work, tmp_path):
    """ChebConv normalises by its sources' OUT-degree, whose edges lie in the pieces of their
    destinations: the pieces' partial sums are added up and routed to every piece holding the
    vertex, so an update at high-out-degree sources (and a self loop) refreshes to the store a
    precompute of the updated graph gives, recomputing what the local refresh recomputes."""
    from test_refresh import cheb_update

    from sparkgnn.pe.refresh import refresh_local

    graph, path = graph_dir
    model = model_of("chebconv", graph.feature_dim, 2)  # 'sym', K=3
    root, local_root = str(tmp_path / "store"), str(tmp_path / "local")
    precompute_local(graph, model, root)
    precompute_local(graph, model, local_root)
    update = cheb_update(graph, seed=3)
    out = str(tmp_path / "graph2")
    result = refresh(spark, path, model, store=root, updates=update.write(str(tmp_path / "update")), out_graph=out,
                     partitions=3, work_dir=shared_work)  # fmt: skip
    new_graph = read_graph_dir(out)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(result.store, scratch, new_graph.ids, model.num_rounds)
    _local, local_report = refresh_local(graph, update, model, local_root)
    assert [s["targets"] for s in result.report.layers] == [s["targets"] for s in local_report.layers]
