"""Inference for requested ids through their k-hop frontier (engine.pruned, planner.pruning) equals
the whole run's rows for those ids (PyG's forward, 1e-5 relative): the driver's local run for every
layer type on Cora and the skewed graph (self loops, duplicates, weights, isolated vertices), the
pruned subgraph under every strategy and P in {1, 3, 8}; auto's choice, explain, refusals."""

import logging
import os

import numpy as np
import pytest
import torch
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from sparkgnn import infer
from sparkgnn.engine import khop
from sparkgnn.errors import PlanError, SparkGNNError
from sparkgnn.models import Model
from sparkgnn.planner import pruning

MODELS = {
    "gcn": lambda f, c: GCN(f, 16, 2, out_channels=c),
    "sage_mean": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c),
    "sage_max": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c, aggr="max"),
    "gin": lambda f, c: GIN(f, 16, 2, out_channels=c),
    "gat": lambda f, c: GAT(f, 8, 2, out_channels=c, heads=2),
}
NAMES = sorted(MODELS)


def _module(name, data):
    torch.manual_seed(len(name))
    return MODELS[name](data.feature_dim, int(data.y.max()) + 1).eval()


def _request(data, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(data.ids, count, replace=False)


def _check(result, module, data, ids):
    table = result.toArrow()
    got_ids = table.column("id").to_numpy()
    assert sorted(got_ids.tolist()) == sorted(ids.tolist()), "the output must hold exactly the requested ids"
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    expected = pyg_reference(module, data)[data.index_of(got_ids)]
    assert relative_error(h, expected) <= 1e-5, relative_error(h, expected)
    assert np.array_equal(table.column("pred").to_numpy(), expected.argmax(axis=1))


@pytest.mark.parametrize("model_name", NAMES)
def test_local_run_equals_pyg_rows(spark, opened_graphs, work_dir, model_name):
    for graph_name, (opened, data) in opened_graphs.items():
        module = _module(model_name, data)
        ids = _request(data, 17, len(model_name))
        job = infer(
            spark,
            opened,
            Model.from_pyg(module),
            ids=ids,
            prune="local",
            work_dir=work_dir,
        )
        result, report, plan = job.frame, job.report, job.plan
        _check(result, module, data, ids)
        assert plan.pruning["mode"] == "local" and plan.strategy == "local", graph_name
        assert plan.pruning["vertices"][0] == len(ids)
        assert [s.label for s in report.steps][:2] == ["pruned frontier", "pruned gather"]


# A Latin square over (strategy, P): each strategy runs once, each partition count once, each with
# its own layer type. What pruning adds to a strategy (the frontier's vertex sets, the subgraph the
# engine runs) does not depend on P; the strategies' exactness at every P and layer type is
# test_infer_exact's, and the local run above covers every layer type.
# The first two cut the subgraph from the frontier collected to the driver (its rows in files for
# prepare's tasks); the last one's frontier exceeds a driver budget made small, so Spark finds it.
COMBOS = [("edge_join", 8), ("replicate", 1), ("combine", 3)]


def _no_spark_frontier(*_args, **_kwargs):
    raise AssertionError("a frontier that fits the driver is not found again in Spark")


@pytest.mark.parametrize("combo", range(len(COMBOS)))
def test_pruned_subgraph_equals_pyg_rows_under_every_strategy(spark, opened_graphs, work_dir, monkeypatch, combo):
    strategy, partitions = COMBOS[combo]
    opened, data = opened_graphs["skewed"]
    if combo == 2:
        monkeypatch.setattr(pruning, "LOCAL_BUDGET_BYTES", 4096)  # ~200 edges: the frontier is Spark's
    else:
        monkeypatch.setattr(khop, "upstream", _no_spark_frontier)
    for model_name in (("gat", "sage_max", "gcn")[combo],):
        module = _module(model_name, data)
        ids = _request(data, 9, combo)
        job = infer(
            spark,
            opened,
            Model.from_pyg(module),
            ids=ids,
            prune="subgraph",
            strategy=strategy,
            partitions=partitions,
            work_dir=work_dir,
            exchange="shuffle",
        )
        result, plan = job.frame, job.plan
        _check(result, module, data, ids)
        assert plan.pruning["mode"] == "subgraph" and {layer.strategy for layer in plan.layers} == {strategy}
        hops = 2 + (1 if model_name == "gcn" else 0)  # GCN's degrees take one more hop of edges
        assert len(plan.pruning["vertices"]) == hops + 1
    rows = os.path.join(work_dir, "pruned-rows")  # the subgraph's row files go once prepare has read them
    assert not os.path.isdir(rows) or not os.listdir(rows)


def test_pruned_subgraph_with_pushdown(spark, opened_graphs, work_dir):
    opened, data = opened_graphs["cora"]
    module = _module("gcn", data)
    ids = _request(data, 12, 3)
    job = infer(
        spark,
        opened,
        Model.from_pyg(module),
        ids=ids,
        prune="subgraph",
        strategy="pushdown",
        partitions=3,
        work_dir=work_dir,
        exchange="shuffle",
    )
    result, plan = job.frame, job.plan
    _check(result, module, data, ids)
    assert {layer.strategy for layer in plan.layers} == {"pushdown"}


def test_auto_prunes_a_small_request_and_explains_it(spark, graph_dirs, work_dir, tmp_path, caplog):
    path, data = graph_dirs["skewed"]
    module = _module("sage_mean", data)
    ids = _request(data, 5, 1)
    caplog.set_level(logging.INFO, logger="sparkgnn")
    out = str(tmp_path / "pred")
    result = infer(spark, path, Model.from_pyg(module), ids=ids, out=out, explain=True, work_dir=work_dir).frame
    _check(result, module, data, ids)
    text = "\n".join(caplog.messages)
    assert "pruning: local est" in text and "frontier vertices: D_0 5 / D_1" in text
    assert "layer 2/2 needs h for D_0 (5 vertices)" in text
    assert "Join" in text and "hop 1: edges" in text and "LocalAggregate" in text
    assert sorted(spark.read.parquet(out).toArrow().column("id").to_numpy().tolist()) == sorted(ids.tolist())


def test_auto_runs_the_whole_graph_when_the_frontier_covers_it(spark, graph_dirs, work_dir, monkeypatch, caplog):
    path, data = graph_dirs["cora"]
    module = _module("sage_mean", data)
    ids = _request(data, 1500, 2)  # two hops of 1,500 Cora vertices reach most of its edges
    monkeypatch.setattr(pruning, "LOCAL_BUDGET_BYTES", 64 * 1024)  # too small for a local run
    caplog.set_level(logging.INFO, logger="sparkgnn")
    job = infer(
        spark,
        path,
        Model.from_pyg(module),
        ids=ids,
        explain=True,
        work_dir=work_dir,
    )
    result, plan = job.frame, job.plan
    _check(result, module, data, ids)
    assert plan.pruning["mode"] == "whole", plan.pruning
    assert "covers" in plan.pruning["blockers"]["subgraph"] and "driver" in plan.pruning["blockers"]["local"]
    assert "\npruning: whole est" in "\n".join(caplog.messages)


def test_forced_modes_that_cannot_apply_are_refused(spark, graph_dirs, work_dir, monkeypatch):
    path, data = graph_dirs["cora"]
    model = Model.from_pyg(_module("gin", data))
    monkeypatch.setattr(pruning, "LOCAL_BUDGET_BYTES", 4096)
    with pytest.raises(PlanError, match="pruning 'local' cannot run this request: .*driver budget"):
        infer(spark, path, model, ids=_request(data, 300, 4), prune="local", work_dir=work_dir)
    with pytest.raises(SparkGNNError, match="unknown prune mode 'some'"):
        infer(spark, path, model, ids=[int(data.ids[0])], prune="some", work_dir=work_dir)


def test_prune_off_skips_the_frontier(spark, graph_dirs, work_dir):
    path, data = graph_dirs["cora"]
    module = _module("gin", data)
    ids = _request(data, 4, 9)
    job = infer(spark, path, Model.from_pyg(module), ids=ids, prune="off", work_dir=work_dir)
    result, plan = job.frame, job.plan
    _check(result, module, data, ids)
    assert plan.pruning == {}


def test_a_subgraph_priced_from_the_collected_frontier_is_cut_from_it(spark, graph_dirs, work_dir, monkeypatch):
    path, data = graph_dirs["skewed"]
    module = _module("sage_mean", data)
    ids = _request(data, 6, 11)
    # the frontier fits the driver, but the local run is priced out: auto takes the subgraph, whose
    # sets are the collected ones (not found again in Spark)
    monkeypatch.setattr(khop, "upstream", _no_spark_frontier)
    monkeypatch.setitem(pruning.PRUNINGS, "local", lambda inputs: (float("inf"), "priced out by the test"))
    monkeypatch.setitem(pruning.PRUNINGS, "whole", lambda inputs: (float("inf"), "priced out by the test"))
    job = infer(spark, path, Model.from_pyg(module), ids=ids, work_dir=work_dir)
    result, plan = job.frame, job.plan
    _check(result, module, data, ids)
    assert plan.pruning["mode"] == "subgraph"


def test_a_subgraph_fingerprint_names_its_parent_ids_and_hops():
    """The pruned subgraph's fingerprint (its layout's key, no pass over it) is the same for the
    same set of ids in any order, and differs with the parent, the ids and the hops."""
    from sparkgnn.engine.pruned import subgraph_fingerprint
    from sparkgnn.graph.fingerprint import check_fingerprint

    parent, other = "0" * 32, "1" * 32
    key = subgraph_fingerprint(parent, np.array([5, 3, 9]), 2)
    assert check_fingerprint(key) == key
    assert subgraph_fingerprint(parent, np.array([9, 5, 3, 3]), 2) == key
    changed = [
        subgraph_fingerprint(other, np.array([5, 3, 9]), 2),
        subgraph_fingerprint(parent, np.array([5, 3]), 2),
        subgraph_fingerprint(parent, np.array([5, 3, 9]), 3),
    ]
    assert len({key, *changed}) == 4
