"""Batch inference on a multi-process cluster (`local-cluster[2,1,1024]`: two executor JVMs, as on a
real cluster) through spark-submit, with executors SIGKILLed during prepare, in the middle of a
layer and between layers, and with the whole job killed after its first layer and run again: every run ends with an
output equal to PyG's, no vertex missing or duplicated, and the rerun resumes after the layer the
killed run committed (engine.run_dir) instead of starting over.

The graph and the work dir are passed as relative paths, which executors resolve against their own
working directory unless the driver made them absolute (files.absolute)."""

import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from cluster_harness import Kill, run_job
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GraphSAGE

from sparkgnn.engine.run_dir import RUNS_DIR
from sparkgnn.models import Model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executors in /proc"),
]
ARGS = ["--graph", "graph", "--model", "model", "--out", "out", "--work-dir", "work", "--partitions", "4"]


@pytest.fixture()
def job_dir(graph_dirs, tmp_path):
    path, data = graph_dirs["cora"]
    os.symlink(path, tmp_path / "graph")
    torch.manual_seed(5)
    module = GraphSAGE(data.feature_dim, 16, 2, out_channels=7).eval()
    Model.from_pyg(module).save(str(tmp_path / "model"))
    return tmp_path, module, data


def _check_output(tmp_path, module, data) -> None:
    table = pq.read_table(tmp_path / "out")
    ids = table.column("id").to_numpy()
    assert len(ids) == len(np.unique(ids)) == data.num_nodes
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    out = np.empty_like(h)
    out[data.index_of(ids)] = h
    assert relative_error(out, pyg_reference(module, data)) <= 1e-5


def test_files_exchange_survives_executors_lost_during_prepare_mid_layer_and_between_layers(job_dir):
    tmp_path, module, data = job_dir
    kills = [
        Kill(path="work/prep/*/P=4/in_edges"),  # the vertex layout is written, the edges' is not
        Kill(path="work/runs/*/step=1/to=*/from=*.arrow"),  # one task of layer 1 done, the other running
        Kill(line="sparkgnn layer 1/2"),  # between the layers
    ]
    run = run_job("batch_inference.py", ARGS + ["--exchange", "files"], tmp_path, kills)
    assert run.returncode == 0, run.output()[-4000:]
    assert all(kill.fired_at for kill in kills), [kill.fired_at for kill in kills]
    _check_output(tmp_path, module, data)
    assert os.listdir(tmp_path / "work" / RUNS_DIR) == []  # a finished run keeps nothing


def test_reliable_shuffle_survives_a_lost_executor_and_a_rerun_resumes_after_the_killed_job(job_dir):
    tmp_path, module, data = job_dir
    args = ARGS + ["--exchange", "shuffle"]  # auto materialisation: Parquet in the work dir on a cluster
    mid_layer = Kill(path="work/runs/*/step=1/attempt=*")
    killed = run_job("batch_inference.py", args, tmp_path, [mid_layer], kill_driver_on="sparkgnn layer 1/2")
    assert mid_layer.fired_at and "sparkgnn layer 1/2" in killed.output(), killed.output()[-4000:]
    assert not (tmp_path / "out").exists()
    rerun = run_job("batch_inference.py", args, tmp_path)
    assert rerun.returncode == 0, rerun.output()[-4000:]
    assert "sparkgnn: resuming after 'layer 1/2: replicate'" in rerun.output()
    assert "sparkgnn scan + scatter" not in rerun.output()  # nothing before the committed step ran again
    _check_output(tmp_path, module, data)
    assert os.listdir(tmp_path / "work" / RUNS_DIR) == []
