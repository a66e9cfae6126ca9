"""Batch inference on a multi-process cluster (`local-cluster[2,1,1024]`: two executor JVMs, as on a
real cluster) through spark-submit, with one executor SIGKILLed as soon as the first layer is
reported: the job finishes and its output equals PyG's, no vertex missing or duplicated. It also
passes the graph and the work dir as relative paths, which executors resolve against their own
working directory unless the driver made them absolute (files.absolute)."""

import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GraphSAGE

from sparkgnn.models import Model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_TIMEOUT_S = 420


def _executor_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"CoarseGrainedExecutorBackend" in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds executors in /proc")
def test_a_job_survives_losing_an_executor_after_the_first_layer(graph_dirs, tmp_path):
    path, data = graph_dirs["cora"]
    os.symlink(path, tmp_path / "graph")
    torch.manual_seed(5)
    module = GraphSAGE(data.feature_dim, 16, 2, out_channels=7).eval()
    Model.from_pyg(module).save(str(tmp_path / "model"))
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    command = [
        spark_submit, "--master", "local-cluster[2,1,1024]", os.path.join(REPO, "spark_jobs", "batch_inference.py"),
        "--graph", "graph", "--model", "model", "--out", "out", "--work-dir", "work", "--partitions", "4",
    ]  # fmt: skip
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed, lines, deadline = None, [], time.monotonic() + JOB_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([job.stdout], [], [], 5)
            if not ready:
                continue
            line = job.stdout.readline()
            if not line:
                break
            lines.append(line)
            if killed is None and "sparkgnn layer 1/2" in line:
                killed = _executor_pids()[0]
                os.kill(killed, signal.SIGKILL)
        assert job.wait(60) == 0, "".join(lines[-20:])
    finally:
        job.kill()
    assert killed is not None, "the job never reported its first layer"
    table = pq.read_table(tmp_path / "out")
    ids = table.column("id").to_numpy()
    assert len(ids) == len(np.unique(ids)) == data.num_nodes
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    out = np.empty_like(h)
    out[data.index_of(ids)] = h
    assert relative_error(out, pyg_reference(module, data)) <= 1e-5
