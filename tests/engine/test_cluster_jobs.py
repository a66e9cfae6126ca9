"""sparkgnn's Spark jobs on a multi-process cluster (`local-cluster[2,1,1024]`: two executor JVMs, as
on a real cluster), with executors SIGKILLed in the middle of their work. The jobs share one
application (cluster_harness.SharedCluster: its JVMs start once for the module), except the run
whose driver is killed, which needs an application of its own; the batch jobs share Cora's
prepared layout (cora_prep).

- Batch inference: executors killed during prepare, in the middle of a layer and between layers;
  the whole job killed after its first layer and run again. Every run ends with an output equal to
  PyG's, no vertex missing or duplicated, and the rerun resumes after the layer the killed run
  committed (engine.run_dir) instead of starting over. The graph and the work dir are passed as
  relative paths, which executors resolve against their own working directory unless the driver
  made them absolute (files.absolute).
- PE precompute: each step is kept as Parquet in the work dir (engine.materialise, reliable on any
  master but local[...]), so Spark reruns the lost tasks only; the store's last layer equals PyG's.
- PE refresh: every task reads and writes only the run directory (a task lost with its executor
  rebuilds its piece elsewhere), so the refreshed store equals a from-scratch precompute of the
  updated graph."""

import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from cluster_harness import Kill, SharedCluster, run_job
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GraphSAGE

from sparkgnn.engine.run_dir import RUNS_DIR
from sparkgnn.graph.updates import apply
from sparkgnn.graph.writer import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe import PEStore
from sparkgnn.pe.local import precompute_local

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from test_refresh import assert_same_store, model_of, random_update  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executors in /proc"),
]
ARGS = ["--graph", "graph", "--model", "model", "--out", "out", "--work-dir", "work", "--partitions", "4"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    shared = SharedCluster(tmp_path_factory.mktemp("cluster"))
    yield shared
    shared.close()


@pytest.fixture(scope="module")
def cora_prep(tmp_path_factory):
    """The `prep` folder of the batch jobs' work dirs (Cora's layout for 4 partitions), shared: the
    files exchange test prepares it (killing an executor meanwhile), the reliable shuffle test's
    killed job reuses it and starts at its first layer, whose kills it is about."""
    return tmp_path_factory.mktemp("cora-prep")


@pytest.fixture()
def job_dir(graph_dirs, cora_prep, tmp_path):
    path, data = graph_dirs["cora"]
    os.symlink(path, tmp_path / "graph")
    os.mkdir(tmp_path / "work")
    os.symlink(cora_prep, tmp_path / "work" / "prep")
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


def test_files_exchange_survives_executors_lost_during_prepare_mid_layer_and_between_layers(cluster, job_dir):
    tmp_path, module, data = job_dir
    kills = [
        Kill(path="work/prep/*/P=4/in_edges"),  # the vertex layout is written, the edges' is not
        Kill(path="work/runs/*/step=1/to=*/from=*.arrow"),  # one task of layer 1 done, the other running
        Kill(line="sparkgnn layer 1/2"),  # between the layers
    ]
    run = cluster.run("batch_inference.py", ARGS + ["--exchange", "files"], tmp_path, kills)
    assert run.returncode == 0, run.output()[-4000:]
    assert all(kill.fired_at for kill in kills), [kill.fired_at for kill in kills]
    assert "prepared graph" in run.output()  # this job prepared the layout: the first kill hit it
    _check_output(tmp_path, module, data)
    assert os.listdir(tmp_path / "work" / RUNS_DIR) == []  # a finished run keeps nothing


def test_reliable_shuffle_survives_a_lost_executor_and_a_rerun_resumes_after_the_killed_job(cluster, job_dir):
    tmp_path, module, data = job_dir
    args = ARGS + ["--exchange", "shuffle"]  # auto materialisation: Parquet in the work dir on a cluster
    mid_layer = Kill(path="work/runs/*/step=1/attempt=*")
    killed = run_job("batch_inference.py", args, tmp_path, [mid_layer], kill_driver_on="sparkgnn layer 1/2")
    assert mid_layer.fired_at and "sparkgnn layer 1/2" in killed.output(), killed.output()[-4000:]
    assert not (tmp_path / "out").exists()
    rerun = cluster.run("batch_inference.py", args, tmp_path)
    assert rerun.returncode == 0, rerun.output()[-4000:]
    assert "sparkgnn: resuming after 'layer 1/2: replicate'" in rerun.output()
    assert "sparkgnn scan + scatter" not in rerun.output()  # nothing before the committed step ran again
    _check_output(tmp_path, module, data)
    assert os.listdir(tmp_path / "work" / RUNS_DIR) == []


def test_precompute_survives_an_executor_lost_mid_layer(cluster, graph_dirs, tmp_path):
    path, data = graph_dirs["skewed"]  # self loops, duplicate edges, weights, isolated vertices; small
    os.symlink(path, tmp_path / "graph")
    torch.manual_seed(6)
    module = GraphSAGE(data.feature_dim, 16, 2, out_channels=5).eval()
    model = Model.from_pyg(module)
    model.save(str(tmp_path / "model"))
    args = ["--graph", "graph", "--model", "model", "--store", "store", "--work-dir", "work", "--partitions", "4",
            "--no-metrics"]  # fmt: skip
    # the exchange the batch job takes here (files: the executors share this disk); the kill comes
    # once one task of layer 1 has written its rows into the store's staged attempt
    mid_layer = Kill(path="store/*/*/layer=1/attempt=*/part-*.parquet")
    run = cluster.run("precompute_pe.py", args, tmp_path, [mid_layer])
    assert run.returncode == 0, run.output()[-4000:]
    assert mid_layer.fired_at, "the kill never fired"
    store = PEStore.open(str(tmp_path / "store"), model=model, graph=path)
    assert store.layers == [1, 2]
    h, _states = store.lookup(data.ids, 2)
    assert relative_error(h, pyg_reference(module, data)) <= 1e-5
    assert os.listdir(tmp_path / "work" / "runs") == []  # precompute keeps no steps: its store resumes


def test_refresh_survives_an_executor_lost_mid_layer(cluster, tmp_path):
    graph = skewed_graph()
    write_graph_dir(graph, str(tmp_path / "graph"))
    model = model_of("gcn", graph.feature_dim, 2)
    model.save(str(tmp_path / "model"))
    precompute_local(graph, model, str(tmp_path / "store"))
    update = random_update(graph, seed=5)
    update.write(str(tmp_path / "update"))
    args = ["--graph", "graph", "--model", "model", "--store", "store", "--updates", "update",
            "--work-dir", "work", "--partitions", "4"]  # fmt: skip
    mid_layer = Kill(path="work/refresh/*/layer=1/out/part=*")
    run = cluster.run("refresh_pe.py", args, tmp_path, [mid_layer])
    assert run.returncode == 0, run.output()[-4000:]
    assert mid_layer.fired_at, "the kill never fired"
    assert "refresh_pe: store version" in run.output()
    new_graph = apply(update, graph).graph
    store = PEStore.open(str(tmp_path / "store"), model=model, graph=new_graph)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, new_graph.ids, 2)
    assert os.listdir(tmp_path / "work" / "refresh") == []
    assert sorted(os.listdir(tmp_path / "work" / "refresh-pieces")) == sorted(
        [graph.fingerprint, new_graph.fingerprint]
    )  # the old graph's pieces built by Spark, the new one's kept by the refresh
