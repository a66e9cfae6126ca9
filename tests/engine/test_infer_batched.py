"""infer(spark, graph, [models]) (model batching, engine.batching): each model's result equals that
model run alone, at P = 1 and 3; models that cannot share an edge list run as another batch;
results go to out/<name> under the output rules; the CLI takes --model more than once."""

import json
import logging
import os
import sys

import numpy as np
import pytest
import torch
from engine_helpers import relative_error, spark_output
from torch_geometric.nn import GCN, GIN, GraphSAGE

from sparkgnn import SparkGNNError, infer
from sparkgnn.errors import OutputError
from sparkgnn.models import Model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
import batch_inference  # noqa: E402

TOL = 1e-5


def _models(data):
    """Two SAGE-mean variants (shared layer-1 payload and aggregation), a 3-layer SAGE-max, a GIN
    (one batch: no self loops anywhere) and a GCN (add_remaining self loops: a batch of its own)."""
    f, c = data.feature_dim, int(data.y.max()) + 1
    builders = [
        lambda: GraphSAGE(f, 16, 2, out_channels=c),
        lambda: GraphSAGE(f, 16, 2, out_channels=c),
        lambda: GraphSAGE(f, 12, 3, out_channels=6, aggr="max"),
        lambda: GIN(f, 16, 2, out_channels=c),
        lambda: GCN(f, 16, 2, out_channels=c),
    ]
    models = []
    for seed, build in enumerate(builders):
        torch.manual_seed(seed)
        models.append(Model.from_pyg(build().eval()))
    return models


@pytest.mark.parametrize("partitions", [1, 3])
def test_batched_models_equal_each_model_alone(spark, opened_graphs, work_dir, partitions, caplog):
    opened, data = opened_graphs["skewed"]
    models = _models(data)
    caplog.set_level(logging.INFO, logger="sparkgnn")
    job = infer(spark, opened, models, partitions=partitions, work_dir=work_dir)
    assert job.names == [f"model_{i}" for i in range(len(models))]
    results = list(job.frames.values())
    # model_0..3 share one job (one report and plan), model_4 runs in a second one
    assert len(job.runs) == 2 and job.reports["model_0"] is job.reports["model_3"] is not job.reports["model_4"]
    assert any("model_0, model_1, model_2, model_3 run as one model" in line for line in caplog.messages), (
        caplog.messages
    )
    assert any("model_4 cannot share an edge list" in line for line in caplog.messages), caplog.messages
    for model, result in zip(models, results, strict=True):
        alone = infer(spark, opened, model, partitions=partitions, work_dir=work_dir).frame
        expected = spark_output(alone, data)
        actual = spark_output(result, data)
        assert not np.isnan(actual).any()
        assert relative_error(actual, expected) <= TOL
        assert result.columns == alone.columns == ["id", "h", "pred"]
        table = result.toArrow()
        h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
        assert np.array_equal(table.column("pred").to_numpy(), torch.from_numpy(h).argmax(dim=1).numpy())


def test_outputs_go_to_out_name_and_nothing_is_replaced_unasked(spark, graph_dirs, work_dir, tmp_path):
    path, data = graph_dirs["skewed"]
    models = _models(data)[:2]
    paths = []
    for name, model in zip(("sage_a", "sage_b"), models, strict=True):
        paths.append(str(tmp_path / name))
        model.save(paths[-1])
    out = tmp_path / "out"
    (out / "other").mkdir(parents=True)
    (out / "other" / "keep.txt").write_text("an earlier result")
    job = infer(spark, path, paths, out=str(out), partitions=2, work_dir=work_dir)
    assert job.names == ["sage_a", "sage_b"]
    results = list(job.frames.values())
    assert sorted(os.listdir(out)) == ["other", "sage_a", "sage_b"]
    assert (out / "other" / "keep.txt").read_text() == "an earlier result"
    for model, result in zip(models, results, strict=True):
        expected = model.forward(torch.from_numpy(data.x), data.edge_index_torch()).numpy()
        assert relative_error(spark_output(result, data), expected) <= TOL
    with pytest.raises(OutputError, match="sage_a"):
        infer(spark, path, paths, out=str(out), work_dir=work_dir)


def test_models_reading_other_widths_are_refused(spark, graph_dirs, work_dir):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(0)
    narrow = Model.from_pyg(GraphSAGE(data.feature_dim - 1, 8, 2).eval())
    with pytest.raises(SparkGNNError, match="same input width"):
        infer(spark, path, [_models(data)[0], narrow], work_dir=work_dir)


def test_cli_runs_repeated_models_in_one_job(spark, graph_dirs, work_dir, tmp_path, capsys):
    path, data = graph_dirs["skewed"]
    paths = []
    for name, model in zip(("first", "second"), _models(data)[:2], strict=True):
        paths.append(str(tmp_path / name))
        model.save(paths[-1])
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    args = ["--graph", path, "--model", paths[0], "--model", paths[1], "--out", str(out), "--work-dir", work_dir]
    assert batch_inference.main([*args, "--partitions", "2", "--report", str(report)]) == 0
    assert "2 models in 1 job(s)" in capsys.readouterr().out
    import pyarrow.parquet as pq

    for name in ("first", "second"):
        table = pq.read_table(str(out / name))
        assert set(table.column_names) == {"id", "h", "pred"} and table.num_rows == data.num_nodes
    doc = json.loads(report.read_text())
    assert doc["models"] == ["first", "second"] and len(doc["jobs"]) == 1
    assert doc["rows"] == {"first": data.num_nodes, "second": data.num_nodes}
    # an existing per-model result is refused before any work (one line, exit 2)
    assert batch_inference.main(args) == 2
    assert "first" in capsys.readouterr().err
