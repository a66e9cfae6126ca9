"""`python -m sparkgnn.datasets`: bad numbers are usage errors, an existing graph is never replaced
without --overwrite, and a refusal is one line with exit code 2."""

import os

import pytest

from sparkgnn.datasets.__main__ import main


def _synthetic(out, *extra):
    return ["synthetic", "--nodes", "50", "--edges", "200", "--dim", "4", "--classes", "3", "--out", str(out), *extra]


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--nodes", "0", "argument --nodes: must be >= 1, got 0"),
        ("--edges", "-3", "argument --edges: must be >= 0, got -3"),
        ("--dim", "x", "argument --dim: must be an integer, got 'x'"),
    ],
)
def test_bad_numbers(tmp_path, capsys, flag, value, message):
    argv = _synthetic(tmp_path / "g")
    argv[argv.index(flag) + 1] = value
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "g")


def test_existing_graph_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(_synthetic(out)) == 0
    capsys.readouterr()
    before = {f: os.path.getmtime(os.path.join(out, "edges", f)) for f in os.listdir(out / "edges")}
    assert main(_synthetic(out, "--seed", "4")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparkgnn.datasets: error:") and "already holds a graph" in err and "--overwrite" in err
    assert {f: os.path.getmtime(os.path.join(out, "edges", f)) for f in os.listdir(out / "edges")} == before
    assert main(_synthetic(out, "--seed", "4", "--overwrite")) == 0
    assert sorted(os.listdir(out)) == ["edges", "graph.json", "vertices"]  # no staging folder left


def test_overwrite_replaces_only_a_graph_sparkgnn_wrote(tmp_path, capsys, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "edges").mkdir(parents=True)
    (mine / "edges" / "notes.txt").write_text("not a graph")
    assert main(_synthetic(mine, "--overwrite")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no graph.json" in err and "will not replace it" in err
    assert sorted(os.listdir(mine)) == ["edges"] and (mine / "edges" / "notes.txt").read_text() == "not a graph"

    monkeypatch.setenv("HOME", str(mine))  # what a shell makes of `--out ~`
    assert main(_synthetic(os.path.expanduser("~"), "--overwrite")) == 2
    assert "is the home directory" in capsys.readouterr().err
    assert sorted(os.listdir(mine)) == ["edges"]
