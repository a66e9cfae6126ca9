"""`sparkgnn-refresh follow` (pe/refresh_cli.py): follows a folder until idle, printing one line per
batch and a summary; a state folder started from another graph is refused in one line, exit 2;
so is a typed graph (typed stores are refreshed by the one-shot mode), before anything is written."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import graph, model_of  # noqa: E402, F401

from sparkgnn.graph import write_graph_dir  # noqa: E402
from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh_cli import main  # noqa: E402


def test_follow_until_idle_then_refuse_a_state_of_another_graph(graph, tmp_path, capsys, monkeypatch):  # noqa: F811
    import torch

    from sparkgnn.pe.follow import RefreshFollower

    threads_seen, run = [], RefreshFollower.run

    def counting_run(self, **kwargs):
        threads_seen.append(torch.get_num_threads())
        return run(self, **kwargs)

    monkeypatch.setattr(RefreshFollower, "run", counting_run)
    threads_before = torch.get_num_threads()
    model = model_of("sage", graph.feature_dim, 2)
    model.save(str(tmp_path / "model"))
    write_graph_dir(graph, str(tmp_path / "g"))
    precompute_local(graph, model, str(tmp_path / "store"))
    os.makedirs(tmp_path / "in")
    ids = graph.ids
    update = GraphUpdate(edge_insert_src=ids[[1]], edge_insert_dst=ids[[2]], edge_insert_weight=np.ones(1, np.float32))
    update.write(str(tmp_path / "in" / "u1.parquet"))
    args = ["follow", "--graph", str(tmp_path / "g"), "--model", str(tmp_path / "model"), "--store",
            str(tmp_path / "store"), "--updates", str(tmp_path / "in"), "--state", str(tmp_path / "state"),
            "--idle-timeout-s", "0.05"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "refresh follow: batch 1: 1 updates from 1 files" in out
    assert "1 batches this run, 1 in all" in out
    assert "1 updates in 1 batches" in out and "batch latency p50" in out  # the run's throughput line
    # the follower ran on --torch-threads' default of one thread; the caller's setting is restored
    assert threads_seen == [1] and torch.get_num_threads() == threads_before
    PEStore.open(str(tmp_path / "store"), model=model, graph=apply(update, graph).graph)
    write_graph_dir(apply(update, graph).graph, str(tmp_path / "g2"))
    args[2] = str(tmp_path / "g2")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "follows from graph" in err[0]


def test_follow_refuses_a_typed_graph_pointing_to_the_one_shot_mode(tmp_path, capsys):
    from typed_testkit import pyg_data, to_hetero_sage, typed_graph

    from sparkgnn.graph.typed_io import write_typed_graph_dir

    data = pyg_data()
    write_typed_graph_dir(typed_graph(data), str(tmp_path / "g"))
    to_hetero_sage(data, layers=2)[1].save(str(tmp_path / "model"))
    os.makedirs(tmp_path / "store")
    os.makedirs(tmp_path / "in")
    args = ["follow", "--graph", str(tmp_path / "g"), "--model", str(tmp_path / "model"), "--store",
            str(tmp_path / "store"), "--updates", str(tmp_path / "in"), "--state", str(tmp_path / "state"),
            "--idle-timeout-s", "0.05"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a typed graph; typed stores are refreshed one update at a time" in err[0]
    assert "refresh_pe.py --engine local" in err[0]
    assert not os.path.exists(tmp_path / "state") and os.listdir(tmp_path / "store") == []
