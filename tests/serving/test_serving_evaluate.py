"""evaluate(): keys per mode, FULL scores itself perfectly; the CLI end to end on a workload dir."""

import json

import numpy as np
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.evaluate import evaluate, main
from sparkgnn.serving.workload import main as workload_main

KEYS = {
    "requests",
    "queries",
    "accuracy",
    "agreement_with_reference",
    "max_rel_err_vs_reference",
    "latency_p50_ms",
    "latency_p99_ms",
    "bytes_fetched_mean",
    "bytes_fetched_total",
    "nodes_recomputed_mean",
    "nodes_recomputed_total",
    "nodes_touched_mean",
    "fetch_s_mean",
    "compute_s_mean",
    "merge_s_mean",
}


def test_evaluate_keys_and_reference(cora_workload):
    wl = cora_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("gcn", G.feature_dim, 2, out=7))
    engines = {"full": QueryEngine(G, model, mode="full"), "ns": QueryEngine(G, model, mode="ns", fanouts=(2, 2))}
    res = evaluate(engines, wl.requests, wl.labels)
    assert set(res) == {"full", "ns"}
    for mode in res:
        assert KEYS <= set(res[mode]["overall"])
        assert set(res[mode]["by_batch_size"]) == {64, 128}
    full = res["full"]["overall"]
    assert full["agreement_with_reference"] == 1.0 and full["max_rel_err_vs_reference"] == 0.0
    assert full["queries"] == sum(r.batch_size for r in wl.requests)
    assert 0.0 <= res["ns"]["overall"]["accuracy"] <= 1.0
    assert res["ns"]["overall"]["bytes_fetched_mean"] <= full["bytes_fetched_mean"]


def test_cli(tmp_path, skewed, capsys):
    write_graph_dir(skewed, str(tmp_path / "g"))
    workload_main(
        ["--graph", str(tmp_path / "g"), "--out", str(tmp_path / "wl"), "--batch-sizes", "8", "--requests", "3"]
    )
    Model.from_pyg(pyg_model("sage", skewed.feature_dim, 2, out=4)).save(str(tmp_path / "m.pt"))
    assert (
        main(
            [
                "--workload",
                str(tmp_path / "wl"),
                "--model",
                str(tmp_path / "m.pt"),
                "--modes",
                "full,ns",
                "--fanouts",
                "3,2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "full" in out and "ns" in out and "p50 ms" in out
    doc = json.loads((tmp_path / "wl" / "evaluation.json").read_text())
    assert doc["fanouts"] == [3, 2] and set(doc["modes"]) == {"full", "ns"}
    assert np.isclose(doc["modes"]["full"]["overall"]["agreement_with_reference"], 1.0)


def test_cli_reuse_modes_with_a_store(tmp_path, skewed, capsys):
    """The CLI opens the store against the workload's G (verified), runs mode specs with SRPE
    budgets and policies, and EXACT agrees with FULL completely."""
    from sparkgnn.graph import read_graph_dir
    from sparkgnn.pe.local import precompute_local

    write_graph_dir(skewed, str(tmp_path / "g"))
    workload_main(
        ["--graph", str(tmp_path / "g"), "--out", str(tmp_path / "wl"), "--batch-sizes", "8", "--requests", "2"]
    )
    model = Model.from_pyg(pyg_model("gcn", skewed.feature_dim, 2, out=4))
    model.save(str(tmp_path / "m.pt"))
    G = read_graph_dir(str(tmp_path / "wl" / "graph"))
    precompute_local(G, model, str(tmp_path / "store"))
    args = ["--workload", str(tmp_path / "wl"), "--model", str(tmp_path / "m.pt"), "--store", str(tmp_path / "store")]
    assert main(args + ["--modes", "he,srpe@0.5/qer,srpe@1/is,exact", "--partitions", "2"]) == 0
    doc = json.loads((tmp_path / "wl" / "evaluation.json").read_text())
    assert set(doc["modes"]) == {"full", "he", "srpe@0.5/qer", "srpe@1/is", "exact"}
    assert doc["modes"]["exact"]["overall"]["agreement_with_reference"] == 1.0
    assert doc["modes"]["exact"]["overall"]["max_rel_err_vs_reference"] < 1e-5
    capsys.readouterr()
    assert main(args + ["--modes", "exact@0.1"]) == 2
    assert "only srpe" in capsys.readouterr().err
    assert main(args[:4] + ["--modes", "he"]) == 2
    assert "pass --store" in capsys.readouterr().err
    other = Model.from_pyg(pyg_model("gcn", skewed.feature_dim, 2, out=4, seed=7))
    other.save(str(tmp_path / "other.pt"))
    assert (
        main(
            [
                "--workload",
                str(tmp_path / "wl"),
                "--model",
                str(tmp_path / "other.pt"),
                "--store",
                str(tmp_path / "store"),
                "--modes",
                "he",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("python -m sparkgnn.serving.evaluate: error: ") and "model weights differ" in err
