"""PE precomputation: each stored h^(l) equals the first l layers of the model; each stored state,
merged with nothing new and updated, reproduces h^(l); a crash after layer 1 resumes to the same
store; a store for other weights is refused."""

import logging

import pytest
import torch
from engine_helpers import relative_error
from torch_geometric.nn import GCN, GIN, GraphSAGE

from sparkgnn import StalePEStore
from sparkgnn.engine import jvm
from sparkgnn.engine.precompute import precompute
from sparkgnn.layers.base import compute_stats, propagate
from sparkgnn.models import Model
from sparkgnn.pe import PEStore


def _layers_in_memory(model, data):
    """h^(1..k) with the in-memory decomposed path (itself tested equal to PyG)."""
    src, dst = (torch.from_numpy(a) for a in (data.edge_src, data.edge_dst))
    weight = torch.from_numpy(data.weight) if data.weight is not None else None
    h = model.pre(torch.from_numpy(data.x))
    outputs, inputs = [], []
    with torch.no_grad():
        for layer in range(model.num_rounds):
            inputs.append(h)
            h = model.post(layer, propagate(model.conv(layer), h, src, dst, weight))
            outputs.append(h.numpy())
    return inputs, outputs


NO_JAR = pytest.mark.skipif(jvm.jar_path() is None, reason="the sparkgnn JVM jar is not built (make jar)")


@pytest.mark.parametrize(
    "build, strategy", [(GraphSAGE, "replicate"), (GCN, "combine"), pytest.param(GIN, "pushdown", marks=NO_JAR)]
)
def test_layers_and_states_reproduce_the_model(spark, graph_dirs, work_dir, tmp_path, build, strategy):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(11)
    model = Model.from_pyg(build(data.feature_dim, 12, 2, out_channels=5).eval())
    result = precompute(
        spark,
        path,
        model,
        store=str(tmp_path / "store"),
        strategy=strategy,
        partitions=3,
        work_dir=work_dir,
        metrics=False,
    )
    store = result.store
    # the exchange the batch job takes here: files on one machine, Spark's rows for pushdown's joins;
    # either way the tasks wrote each layer's files themselves (no Spark-written part names)
    assert result.report.exchange == ("shuffle" if strategy == "pushdown" else "files")
    written = sorted(p.name for p in (tmp_path / "store").rglob("part-*.parquet"))
    assert written and all(name.startswith("part-0") and name.endswith(".parquet") for name in written)
    assert not any(".snappy." in name for name in written)
    inputs, outputs = _layers_in_memory(model, data)
    src, dst = (torch.from_numpy(a) for a in (data.edge_src, data.edge_dst))
    weight = torch.from_numpy(data.weight) if data.weight is not None else None
    for layer in (1, 2):
        h, state = store.lookup(data.ids, layer, states=True)
        assert relative_error(h, outputs[layer - 1]) <= 1e-5
        conv = model.conv(layer - 1)
        stats = compute_stats(conv, src, dst, weight, data.num_nodes)
        with torch.no_grad():
            merged = conv.aggregator.merge(torch.from_numpy(state), torch.arange(data.num_nodes), data.num_nodes)
            again = model.post(
                layer - 1, conv.update(inputs[layer - 1], conv.aggregator.finalize(merged), stats, False)
            )
        assert relative_error(again.numpy(), outputs[layer - 1]) <= 1e-5


def test_crash_after_layer_one_resumes_to_the_same_store(spark, graph_dirs, work_dir, tmp_path, caplog):
    """A job that crashed after committing layer 1 resumes from the stored rows, and every stored
    row and state equals the single-machine precompute's. The model is a 3-layer JumpingKnowledge
    'cat' stack (SAGE and GCN alternating), so the stored rows carry the earlier rounds' outputs
    the later rounds read (a chain model's rows are the special case without carried columns)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
    from serving_testkit import pyg_model

    from sparkgnn.pe.local import precompute_local

    path, data = graph_dirs["skewed"]
    model = Model.from_pyg(pyg_model("jk_cat", data.feature_dim, 3, seed=6))
    local = precompute_local(data, model, str(tmp_path / "local"))

    class Crash(Exception):
        pass

    def crash_after_first(layer):
        if layer == 1:
            raise Crash

    root = str(tmp_path / "spark")
    options = {"store": root, "strategy": "combine", "partitions": 3, "work_dir": work_dir, "metrics": False}
    with pytest.raises(Crash):
        precompute(spark, path, model, on_layer_committed=crash_after_first, **options)
    caplog.set_level(logging.INFO, logger="sparkgnn")
    store = precompute(spark, path, model, **options).store
    assert any("resuming" in line for line in caplog.messages)
    assert store.manifest["dims"] == local.manifest["dims"] == [32, 48, 5]
    for layer in (1, 2, 3):
        h, state = store.lookup(data.ids, layer, states=True)
        h0, state0 = local.lookup(data.ids, layer, states=True)
        assert relative_error(h, h0) <= 1e-5 and relative_error(state, state0) <= 1e-5, layer


def test_store_for_other_weights_is_refused(spark, graph_dirs, work_dir, tmp_path):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(4)
    module = GraphSAGE(data.feature_dim, 8, 2).eval()
    root = str(tmp_path / "store")
    precompute(spark, path, Model.from_pyg(module), store=root, work_dir=work_dir, metrics=False)
    with torch.no_grad():
        module.convs[0].lin_l.weight[0, 0] += 1.0
    with pytest.raises(StalePEStore, match="model"):
        PEStore.open(root, model=Model.from_pyg(module), graph=path)


def test_precompute_job_with_metrics(spark, graph_dirs, work_dir, tmp_path, capsys):
    import json
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
    import precompute_pe

    path, data = graph_dirs["skewed"]
    torch.manual_seed(6)
    model_path = str(tmp_path / "model")
    Model.from_pyg(GraphSAGE(data.feature_dim, 8, 2).eval()).save(model_path)
    root, report = str(tmp_path / "store"), str(tmp_path / "report.json")
    argv = ["--graph", path, "--model", model_path, "--store", root, "--work-dir", work_dir, "--fanouts", "5,3"]
    assert precompute_pe.main([*argv, "--report", report]) == 0
    assert "store complete" in capsys.readouterr().out
    with open(report) as fh:
        doc = json.load(fh)
    assert {"workload metrics", "layer commits", "prepare"} <= {row["name"] for row in doc["phases"]} and doc[
        "layers"
    ] == [1, 2]
    assert doc["unaccounted_s"] >= 0 and len(doc["steps"]) >= 2
    store = PEStore.open(root, model=model_path, graph=path)
    assert store.layers == [1, 2] and store.with_states
    summary = store.manifest["metrics"]["summary"]
    assert summary["psgs"]["max"] >= summary["psgs"]["mean"] > 1
    report = store.size_report()
    assert report["omega_formula_bytes"] == 8 * 4 * data.num_nodes
