"""The pushdown strategy (planner/pushdown.py, engine/pushdown.py): messages and aggregation in Spark
with the JVM module's native aggregates, the update in the DL engine. Equal to PyTorch Geometric
(1e-5 relative) for every layer type it can run, P in {1, 3, 8}, on Cora and the skewed graph
(self loops, duplicate edges, weights, isolated vertices); every step reports the listener's task
metrics; refused with the reason for the others."""

import logging

import numpy as np
import pytest
import torch
from engine_helpers import pyg_reference, relative_error, spark_output
from torch_geometric.nn import GAT, GCN, GIN, GraphSAGE

from sparkgnn import infer
from sparkgnn.engine import jvm
from sparkgnn.errors import PlanError
from sparkgnn.models import Model

pytestmark = pytest.mark.skipif(jvm.jar_path() is None, reason="the sparkgnn JVM jar is not built (make jar)")

MODELS = {
    "gcn": lambda f, c: GCN(f, 16, 2, out_channels=c),
    "sage_mean": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c),
    "sage_max": lambda f, c: GraphSAGE(f, 16, 2, out_channels=c, aggr="max"),
    "gin": lambda f, c: GIN(f, 16, 2, out_channels=c),
}


def _module(name, data):
    torch.manual_seed(len(name) + 1)
    return MODELS[name](data.feature_dim, int(data.y.max()) + 1).eval()


# Every layer type at P = 1 (one partition: every edge local) and at one P > 1, once on each graph;
# each P meets both graphs. P = 3 and P = 8 take the same path (engine.pushdown repartitions into the
# plan's P and sets the aggregate's shuffle partitions to it), so a layer type needs only one of them.
CASES = [
    ("gcn", 1, "cora"),
    ("gcn", 8, "skewed"),
    ("gin", 1, "skewed"),
    ("gin", 3, "cora"),
    ("sage_max", 1, "cora"),
    ("sage_max", 3, "skewed"),
    ("sage_mean", 1, "skewed"),
    ("sage_mean", 8, "cora"),
]


@pytest.mark.parametrize(("model_name", "partitions", "graph_name"), CASES)
def test_pushdown_equals_pyg(spark, opened_graphs, work_dir, model_name, partitions, graph_name, caplog):
    caplog.set_level(logging.INFO, logger="sparkgnn")
    for opened, data in (opened_graphs[graph_name],):
        module = _module(model_name, data)
        job = infer(
            spark,
            opened,
            Model.from_pyg(module),
            strategy="pushdown",
            partitions=partitions,
            work_dir=work_dir,
            explain=True,
        )
        result, report, plan = job.frame, job.report, job.plan
        assert [layer.strategy for layer in plan.layers] == ["pushdown", "pushdown"]
        assert report.exchange == "shuffle"  # auto exchange + a strategy that joins in Spark
        actual = spark_output(result, data)
        expected = pyg_reference(module, data)
        assert not np.isnan(actual).any(), f"{graph_name}: some vertices have no output row"
        assert relative_error(actual, expected) <= 1e-5, (graph_name, relative_error(actual, expected))
        # with the jar, every step's report carries the listener's task times next to the shuffle bytes
        for step in report.steps:
            assert step.shuffle is not None and step.shuffle["listener_complete"], step
            assert step.shuffle["tasks"] > 0 and step.shuffle["task_run_s"] >= 0
        assert sum(step.shuffle["shuffle_write_bytes"] for step in report.steps) > 0
    explained = "\n".join(caplog.messages)
    assert "pushdown" in explained and "sparkgnn_vec_" in explained


def test_pushdown_refuses_attention_with_the_reason(spark, graph_dirs, work_dir):
    path, data = graph_dirs["cora"]
    module = GAT(data.feature_dim, 8, 2, out_channels=3, heads=2).eval()
    with pytest.raises(PlanError, match="strategy 'pushdown' cannot run .* reads the destination"):
        infer(spark, path, Model.from_pyg(module), strategy="pushdown", work_dir=work_dir)


def test_pushdown_needs_the_shuffle_exchange(spark, graph_dirs, work_dir):
    path, data = graph_dirs["cora"]
    module = _module("gin", data)
    with pytest.raises(PlanError, match="files exchange carries routed rows only"):
        infer(
            spark,
            path,
            Model.from_pyg(module),
            strategy="pushdown",
            exchange="files",
            work_dir=work_dir,
        )
