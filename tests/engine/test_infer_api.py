"""infer(): requested ids, clear errors for bad inputs, the spark job entry point."""

import json
import logging
import os
import sys

import numpy as np
import pytest
import torch
from engine_helpers import pyg_reference, relative_error
from torch_geometric.nn import GraphSAGE

from sparkgnn import GraphValidationError, SparkGNNError, infer
from sparkgnn.graph import Graph
from sparkgnn.models import Model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
import batch_inference  # noqa: E402


def _sage(data, hidden=8):
    torch.manual_seed(1)
    return GraphSAGE(data.feature_dim, hidden, 2, out_channels=int(data.y.max()) + 1).eval()


def test_only_requested_ids_are_returned(spark, graph_dirs, work_dir):
    path, data = graph_dirs["skewed"]
    module = _sage(data)
    wanted = data.ids[[0, 5, 17, 400]].tolist()
    result = infer(spark, path, Model.from_pyg(module), ids=wanted, work_dir=work_dir).frame
    table = result.toArrow()
    assert sorted(table.column("id").to_pylist()) == sorted(wanted)
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    expected = pyg_reference(module, data)[data.index_of(table.column("id").to_numpy())]
    assert relative_error(h, expected) <= 1e-5


def test_graph_with_nan_features_is_refused_naming_the_rows(spark, graph_dirs, work_dir):
    _, data = graph_dirs["skewed"]
    vertices = spark.createDataFrame([(1, [0.0, float("nan")]), (2, [1.0, 2.0])], "id long, x array<float>")
    edges = spark.createDataFrame([(1, 2)], "src long, dst long")
    model = Model.from_pyg(GraphSAGE(2, 4, 2).eval())
    with pytest.raises(GraphValidationError, match="NaN"):
        infer(spark, Graph(vertices, edges), model, work_dir=work_dir)


def test_model_width_mismatch_is_named(spark, graph_dirs, work_dir):
    path, data = graph_dirs["skewed"]
    model = Model.from_pyg(GraphSAGE(data.feature_dim + 1, 4, 2).eval())
    with pytest.raises(SparkGNNError, match=f"{data.feature_dim} wide but the model expects {data.feature_dim + 1}"):
        infer(spark, path, model, work_dir=work_dir)


def test_batch_job_writes_parquet_and_explains(spark, graph_dirs, work_dir, tmp_path, capsys):
    path, data = graph_dirs["skewed"]
    module = _sage(data)
    model_path = str(tmp_path / "model")
    Model.from_pyg(module).save(model_path)
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# two vertices\n" + "\n".join(str(i) for i in data.ids[:2]) + "\n")
    out = str(tmp_path / "out")
    code = batch_inference.main(
        [
            "--graph",
            path,
            "--model",
            model_path,
            "--out",
            out,
            "--strategy",
            "combine",
            "--partitions",
            "3",
            "--explain",
            "--work-dir",
            work_dir,
            "--ids",
            str(ids_file),
            "--report",
            str(tmp_path / "report.json"),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "strategy=combine" in printed and "[GRAPH]" in printed and "[DL]" in printed and "[PIPE]" in printed
    assert "sparkgnn layer 1 (combine): estimated" in printed and "sparkgnn layer 2 (combine): estimated" in printed
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert set(table.column_names) == {"id", "h", "pred"}
    assert sorted(table.column("id").to_pylist()) == sorted(data.ids[:2].tolist())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rows"] == 2 and report["partitions"] == 3 and report["strategies"] == ["combine", "combine"]
    # every step is charged to one layer (-1: loading x); the per-layer sums add up to the steps
    assert set(report["seconds_by_layer"]) == {"-1", "0", "1"}
    assert sum(report["seconds_by_layer"].values()) == pytest.approx(
        sum(s["seconds"] for s in report["steps"]), abs=0.01
    )
    assert [r["layer"] for r in report["estimate_vs_actual"]] == [0, 1]
    assert all(r["estimate_s"] > 0 and r["actual_s"] > 0 for r in report["estimate_vs_actual"])
    assert report["total_s"] >= report["session_start_s"] + report["prepare_s"]
    # the whole wall time by phase, the rest as unaccounted (engine.phases)
    phases = {row["name"]: row["seconds"] for row in report["phases"]}
    assert {"python start and imports", "JVM and session start", "graph open", "model store"} <= set(phases)
    assert all(step["label"] in phases for step in report["steps"])
    assert sum(phases.values()) == pytest.approx(report["wall_s"] - report["unaccounted_s"], abs=1e-6)
    assert report["unaccounted_fraction"] == pytest.approx(report["unaccounted_s"] / report["wall_s"], abs=1e-4)
    assert "sparkgnn batch_inference time: " in printed and "  unaccounted  " in printed  # the table, at the end
    # an existing report is not overwritten without --overwrite (refused before any Spark work)
    with pytest.raises(SystemExit):
        batch_inference.main(
            [
                "--graph",
                path,
                "--model",
                model_path,
                "--out",
                str(tmp_path / "out2"),
                "--report",
                str(tmp_path / "report.json"),
            ]
        )
    assert "--report" in capsys.readouterr().err


def test_batch_job_rejects_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        batch_inference.main(["--graph", str(tmp_path / "missing"), "--model", "x", "--out", "y"])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        batch_inference.main(["--graph", str(tmp_path), "--model", str(tmp_path), "--out", "y", "--partitions", "0"])
    assert "--partitions: must be >= 1" in capsys.readouterr().err


def test_combine_layouts_are_written_only_when_a_plan_reads_them(spark, graph_dirs, tmp_path, caplog):
    # A replicate job writes the base layouts; out_edges/in_targets appear (under their own marker)
    # the first time a plan picks combine, and that job still equals PyG.
    from sparkgnn.engine.prepare import ON_DEMAND_MARKER

    path, data = graph_dirs["skewed"]
    module = _sage(data)
    work = str(tmp_path / "work")
    infer(spark, path, Model.from_pyg(module), strategy="replicate", partitions=3, work_dir=work)
    (prep_dir,) = [os.path.join(root, d) for root, dirs, _ in os.walk(work) for d in dirs if d == "P=3"]
    # "local" holds the per-partition indexes derived from the layouts (engine.static) and
    # "features" the files exchange's kept feature scan (engine.exchange.keep_features): no layout.
    written = sorted(set(os.listdir(prep_dir)) - {"local", "features"})
    assert written == ["in_edges", "out_targets", "prepared.json", "vertices"]
    caplog.set_level(logging.INFO, logger="sparkgnn")
    result = infer(spark, path, Model.from_pyg(module), strategy="combine", partitions=3, work_dir=work).frame
    assert {"out_edges", "in_targets", ON_DEMAND_MARKER} <= set(os.listdir(prep_dir))
    assert any("wrote the combine layouts" in line for line in caplog.messages)
    table = result.toArrow()
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    expected = pyg_reference(module, data)[data.index_of(table.column("id").to_numpy())]
    assert relative_error(h, expected) <= 1e-5


def test_tasks_write_the_output_parts_themselves_and_spark_reads_them_back(spark, graph_dirs, work_dir, tmp_path):
    path, data = graph_dirs["skewed"]
    module = _sage(data)
    out = str(tmp_path / "out")
    result = infer(spark, path, Model.from_pyg(module), partitions=3, out=out, work_dir=work_dir).frame
    assert sorted(os.listdir(out)) == ["_SPARKGNN_OUTPUT.json", *(f"part-{p:05d}.parquet" for p in range(3))]
    assert [(f.name, f.dataType.simpleString()) for f in result.schema.fields] == [
        ("id", "bigint"),
        ("h", "array<float>"),
        ("pred", "bigint"),
    ]
    table = result.toArrow()
    assert table.num_rows == data.num_nodes
    h = np.stack(table.column("h").to_numpy(zero_copy_only=False))
    expected = pyg_reference(module, data)[data.index_of(table.column("id").to_numpy())]
    assert relative_error(h, expected) <= 1e-5
    assert (table.column("pred").to_numpy() == expected.argmax(axis=1)).all()


def test_a_failed_commit_of_task_written_parts_keeps_the_earlier_result(
    spark, graph_dirs, work_dir, tmp_path, monkeypatch
):
    from sparkgnn.engine import executor

    path, data = graph_dirs["skewed"]
    model = Model.from_pyg(_sage(data))
    out = str(tmp_path / "out")
    infer(spark, path, model, out=out, work_dir=work_dir)
    before = {name: os.path.getsize(os.path.join(out, name)) for name in os.listdir(out)}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(executor, "_commit_task_files", broken)
    with pytest.raises(OSError, match="disk full"):
        infer(spark, path, model, out=out, overwrite=True, work_dir=work_dir)
    assert {name: os.path.getsize(os.path.join(out, name)) for name in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no staging directory left behind


# -- the public call form: keyword-only options, one result type, the old forms deprecated ----------


@pytest.fixture
def fake_run(monkeypatch):
    """infer's single-model run replaced by a recorder: the call forms are checked without Spark."""
    from sparkgnn.engine import api

    calls = []

    def run(spark, graph, model, **options):
        calls.append(options)
        return f"frame of {model}", "report", "plan"

    monkeypatch.setattr(api, "_infer_one", run)
    return calls


def test_infer_returns_a_job_result_keyed_by_model_name(fake_run):
    from sparkgnn import JobResult

    result = infer(None, "g", "models/sage_a/", out="o", strategy="combine")
    assert isinstance(result, JobResult) and result.names == ["sage_a"]
    assert (result.frame, result.report, result.plan) == ("frame of models/sage_a/", "report", "plan")
    assert fake_run[0]["out"] == "o" and fake_run[0]["strategy"] == "combine"
    assert infer(None, "g", object()).names == ["model"]  # a model that is not a path


def test_options_after_model_are_keyword_only():
    import inspect

    params = list(inspect.signature(infer).parameters.values())
    assert [p.name for p in params[:3]] == ["spark", "graph", "model"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:])
    assert "return_report" not in {p.name for p in params}
    with pytest.raises(TypeError, match="takes 3 positional arguments"):
        infer(None, "g", "m", *range(16))  # more than the previous release ever took
    with pytest.raises(TypeError, match="multiple values for out"):
        infer(None, "g", "m", "o", out="o")
    with pytest.raises(TypeError, match="unexpected keyword"):
        infer(None, "g", "m", strategie="combine")


def test_positional_options_still_work_with_a_deprecation_warning(fake_run):
    with pytest.deprecated_call(match=r"out, strategy by position"):
        frame = infer(None, "g", "m", "o", "replicate")
    assert frame == "frame of m"  # the previous release's return value: the DataFrame
    assert fake_run[-1]["out"] == "o" and fake_run[-1]["strategy"] == "replicate"


def test_return_report_still_works_with_a_deprecation_warning(fake_run):
    with pytest.deprecated_call(match="return_report"):
        assert infer(None, "g", "m", return_report=True) == ("frame of m", "report", "plan")
    with pytest.deprecated_call(match="return_report"):
        assert infer(None, "g", "m", return_report=False) == "frame of m"


def test_a_result_of_several_models_names_them_for_frame_and_converts_to_the_old_lists():
    from sparkgnn.engine.result import JobResult

    shared, alone = object(), object()
    result = JobResult({"a": 1, "b": 2, "c": 3}, {"a": shared, "b": shared, "c": alone}, {"a": "p", "b": "p", "c": "q"})
    with pytest.raises(SparkGNNError, match=r"3 models \(a, b, c\): use result.frames\[name\]"):
        _ = result.frame
    with pytest.raises(SparkGNNError, match=r"result.reports\[name\]"):
        _ = result.report
    assert result.runs == [(shared, "p"), (alone, "q")]  # one (report, plan) per job that ran
    assert result.legacy(as_list=True, with_report=False) == [1, 2, 3]
    assert result.legacy(as_list=True, with_report=True) == ([1, 2, 3], [shared, alone], ["p", "q"])


def test_precompute_and_refresh_take_keyword_options_and_refuse_old_positionals_beyond_theirs():
    import inspect

    from sparkgnn import precompute, refresh

    for fn, required in ((precompute, {"store"}), (refresh, {"store", "updates"})):
        params = list(inspect.signature(fn).parameters.values())[3:]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), fn.__name__
        assert {p.name for p in params if p.default is inspect.Parameter.empty} == required
        with pytest.raises(TypeError, match="takes 3 positional arguments"):
            fn(None, "g", "m", *range(20))
