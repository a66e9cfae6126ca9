"""Batch inference through the messenger (standalone PyTorch workers) equals in-process output,
also when workers are SIGKILLed mid-job."""

import logging
import os
import signal
import threading

import numpy as np
import torch
from engine_helpers import spark_output
from torch_geometric.nn import GraphSAGE

from sparkgnn import infer
from sparkgnn.messenger.local import LocalCluster
from sparkgnn.models import Model


def _model(data):
    torch.manual_seed(3)
    return Model.from_pyg(GraphSAGE(data.feature_dim, 8, 3, out_channels=5).eval())


def test_local_workers_equal_inprocess(spark, graph_dirs, work_dir):
    path, data = graph_dirs["skewed"]
    model = _model(data)
    inprocess = spark_output(infer(spark, path, model, partitions=3, work_dir=work_dir).frame, data)
    via_workers = spark_output(
        infer(spark, path, model, partitions=3, work_dir=work_dir, workers="local[2]").frame, data
    )
    # The workers run torch's default thread count, the in-process run the plan's threads per task:
    # a GEMM may block its sums differently at another thread count (a few ulp), so compare at the
    # exactness bar (a wrong row would be off by its whole value).
    np.testing.assert_allclose(via_workers, inprocess, rtol=1e-5, atol=1e-6)


def test_sigkilled_workers_lose_no_batch_and_apply_none_twice(spark, graph_dirs, work_dir, caplog):
    path, data = graph_dirs["skewed"]
    model = _model(data)
    expected = spark_output(infer(spark, path, model, partitions=4, work_dir=work_dir).frame, data)
    store = os.path.join(work_dir, "models")
    killed = []
    with LocalCluster(3, model_store=store, threads=1, heartbeat_s=0.5, liveness=3) as cluster:

        def kill(index):
            worker = cluster.workers[index]
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGKILL)
                killed.append(worker.pid)

        class OnProgress(logging.Handler):
            def emit(self, record):
                if "scan + scatter" in record.getMessage():  # between steps: one worker dies ...
                    kill(0)
                    threading.Timer(0.2, kill, args=(1,)).start()  # ... and another while a step runs

        caplog.set_level(logging.INFO, logger="sparkgnn.engine")
        hook = OnProgress()
        logging.getLogger("sparkgnn.engine").addHandler(hook)
        try:
            result = infer(spark, path, model, partitions=4, work_dir=work_dir, workers=cluster).frame
        finally:
            logging.getLogger("sparkgnn.engine").removeHandler(hook)
        table = result.toArrow()
    ids = table.column("id").to_numpy()
    assert len(killed) == 2
    assert len(ids) == len(np.unique(ids)) == data.num_nodes  # every vertex once: nothing lost, nothing twice
    # These workers run one torch thread each while the in-process run uses the plan's, so a GEMM may
    # block its sums differently (1 ulp seen on a many-core CI host): compare at the exactness bar. A
    # batch applied twice would be off by its whole value.
    np.testing.assert_allclose(spark_output(result, data), expected, rtol=1e-5, atol=1e-6)
