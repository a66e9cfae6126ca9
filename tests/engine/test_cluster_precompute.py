"""PE precomputation on a multi-process cluster (`local-cluster[2,1,1024]`) through spark-submit,
one executor SIGKILLed in the middle of a layer: each step is kept as Parquet in the work dir
(engine.materialise, reliable on any master but local[...]), so Spark reruns the lost tasks only;
the store's last layer equals PyG's output for every vertex."""

import os
import sys

import pytest
import torch
from cluster_harness import Kill, run_job
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GraphSAGE

from sparkgnn.models import Model
from sparkgnn.pe import PEStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executors in /proc"),
]


def test_precompute_survives_an_executor_lost_mid_layer(graph_dirs, tmp_path):
    path, data = graph_dirs["skewed"]  # self loops, duplicate edges, weights, isolated vertices; small
    os.symlink(path, tmp_path / "graph")
    torch.manual_seed(6)
    module = GraphSAGE(data.feature_dim, 16, 2, out_channels=5).eval()
    model = Model.from_pyg(module)
    model.save(str(tmp_path / "model"))
    args = ["--graph", "graph", "--model", "model", "--store", "store", "--work-dir", "work", "--partitions", "4",
            "--no-metrics"]  # fmt: skip
    mid_layer = Kill(path="work/runs/*/step=1/attempt=*")
    run = run_job("precompute_pe.py", args, tmp_path, [mid_layer])
    assert run.returncode == 0, run.output()[-4000:]
    assert mid_layer.fired_at, "the kill never fired"
    store = PEStore.open(str(tmp_path / "store"), model=model, graph=path)
    assert store.layers == [1, 2]
    h, _states = store.lookup(data.ids, 2)
    assert relative_error(h, pyg_reference(module, data)) <= 1e-5
    assert os.listdir(tmp_path / "work" / "runs") == []  # precompute keeps no steps: its store resumes
