"""The serving CLIs (workload, evaluate) refuse bad numbers in argparse (exit 2, the error names
the flag), print sparkgnn's own errors and the user's OS errors as ONE `prog: error: ...` line
with exit 2 (no traceback), and never delete or replace existing data unless told to
(--overwrite); a refused run writes nothing."""

import json
import os
import subprocess
import sys

import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.serving.evaluate import main as evaluate_main
from sparkgnn.serving.workload import main as workload_main

WORKLOAD = "python -m sparkgnn.serving.workload"
EVALUATE = "python -m sparkgnn.serving.evaluate"


def tree(root) -> dict:
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            st = os.stat(path)
            out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return out


def one_error_line(err: str, prog: str) -> str:
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def graph_dir(skewed, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cli_graph") / "g")
    write_graph_dir(skewed, path)
    return path


@pytest.fixture(scope="module")
def workload_dir(graph_dir, skewed, tmp_path_factory):
    """A written workload and a saved model for the evaluate refusals."""
    root = tmp_path_factory.mktemp("cli_wl")
    wl = str(root / "wl")
    assert workload_main(["--graph", graph_dir, "--out", wl, "--batch-sizes", "8", "--requests", "2"]) == 0
    model = str(root / "m.pt")
    Model.from_pyg(pyg_model("sage", skewed.feature_dim, 2, out=4)).save(model)
    return wl, model


# -- workload ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--requests", "-1", "must be >= 1, got -1"),
        ("--requests", "0", "must be >= 1, got 0"),
        ("--requests", "two", "must be an integer, got 'two'"),
        ("--batch-sizes", "0", "'0' must be >= 1, got 0"),
        ("--batch-sizes", "8,x", "'x' must be an integer"),
        ("--batch-sizes", ",", "needs at least one integer"),
        ("--seed", "-3", "must be >= 0, got -3"),
    ],
)
def test_workload_bad_numbers_are_usage_errors_naming_the_flag(graph_dir, tmp_path, capsys, flag, value, words):
    args = {"--graph": graph_dir, "--out": str(tmp_path / "wl"), "--batch-sizes": "8", "--requests": "1"}
    args[flag] = value
    with pytest.raises(SystemExit) as exit_:
        workload_main([x for kv in args.items() for x in kv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}: " in err and words in err, err
    assert not os.path.exists(tmp_path / "wl")


def test_workload_refuses_an_existing_workload_unless_overwrite(graph_dir, tmp_path, capsys):
    out = str(tmp_path / "wl")
    base = ["--graph", graph_dir, "--out", out, "--batch-sizes", "8", "--requests", "2"]
    assert workload_main(base) == 0
    capsys.readouterr()
    before = tree(out)
    assert workload_main(base[:-1] + ["3"]) == 2
    line = one_error_line(capsys.readouterr().err, WORKLOAD)
    assert f"--out {out} already holds" in line and "--overwrite" in line
    assert tree(out) == before  # nothing deleted or replaced
    # told to: the old workload is replaced as a whole (no request file of the old one remains)
    assert workload_main(base[:-1] + ["3", "--seed", "4", "--overwrite"]) == 0
    doc = json.load(open(os.path.join(out, "workload.json")))
    assert doc["num_requests"] == 3 and doc["seed"] == 4
    assert len(os.listdir(os.path.join(out, "requests"))) == 3
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no staging left behind


def test_workload_user_errors_are_one_line_and_write_nothing(graph_dir, tmp_path, capsys):
    # a batch larger than the query pool: refused before anything is written
    out = str(tmp_path / "big")
    assert workload_main(["--graph", graph_dir, "--out", out, "--batch-sizes", "100000"]) == 2
    assert "exceeds the query pool" in one_error_line(capsys.readouterr().err, WORKLOAD)
    assert not os.path.exists(out)
    # --out is the input graph: never written over, even with --overwrite
    before = tree(graph_dir)
    assert workload_main(["--graph", graph_dir, "--out", graph_dir, "--overwrite", "--batch-sizes", "8"]) == 2
    assert "is the --graph" in one_error_line(capsys.readouterr().err, WORKLOAD)
    assert tree(graph_dir) == before
    # an OS error (a path below a regular file) and a missing graph
    (tmp_path / "file").write_text("keep me")
    assert workload_main(["--graph", graph_dir, "--out", str(tmp_path / "file" / "wl"), "--batch-sizes", "8"]) == 2
    one_error_line(capsys.readouterr().err, WORKLOAD)
    assert (tmp_path / "file").read_text() == "keep me"
    assert workload_main(["--graph", str(tmp_path / "nope"), "--out", str(tmp_path / "wl2")]) == 2
    assert "nope" in one_error_line(capsys.readouterr().err, WORKLOAD)
    assert not os.path.exists(tmp_path / "wl2")


def test_workload_cli_process_exits_2_with_a_usage_error_not_a_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkgnn.serving.workload",
            "--graph",
            str(tmp_path),
            "--out",
            str(tmp_path / "wl"),
            "--batch-sizes",
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "Warning" not in proc.stderr
    assert "error: argument --batch-sizes: 'x': 'x' must be an integer" in proc.stderr


# -- evaluate ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--fanouts", "a,b", "'a' must be an integer"),
        ("--fanouts", "3,0", "'0' must be >= 1"),
        ("--gamma", "0", "must be in (0, 1]"),
        ("--gamma", "1.5", "must be in (0, 1]"),
        ("--gamma", "nan", "must be in (0, 1]"),
        ("--gamma", "lots", "must be a number in (0, 1]"),
        ("--partitions", "0", "must be >= 1, got 0"),
        ("--seed", "-1", "must be >= 0"),
        ("--policy", "best", "invalid choice: 'best'"),
        ("--ns-norm", "other", "invalid choice: 'other'"),
    ],
)
def test_evaluate_bad_options_are_usage_errors_naming_the_flag(workload_dir, capsys, flag, value, words):
    wl, model = workload_dir
    with pytest.raises(SystemExit) as exit_:
        evaluate_main(["--workload", wl, "--model", model, flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}: " in err and words in err, err
    assert not os.path.exists(os.path.join(wl, "evaluation.json"))


@pytest.mark.parametrize(
    "modes, words",
    [
        ("full,srpe@x", "mode spec 'srpe@x': gamma must be a number in (0, 1]"),
        ("srpe@2/qer", "mode spec 'srpe@2/qer': gamma must be in (0, 1]"),
        ("srpe@0.5/best", "unknown SRPE policy 'best'"),
        ("full,magic", "unknown serving mode 'magic'"),
        ("exact@0.1", "only srpe takes @gamma"),
        ("he", "pass --store"),
    ],
)
def test_evaluate_bad_mode_specs_are_one_line_refusals(workload_dir, capsys, modes, words):
    wl, model = workload_dir
    assert evaluate_main(["--workload", wl, "--model", model, "--modes", modes]) == 2
    assert words in one_error_line(capsys.readouterr().err, EVALUATE)
    assert not os.path.exists(os.path.join(wl, "evaluation.json"))


def test_evaluate_missing_or_broken_inputs_are_one_line_refusals(workload_dir, tmp_path, capsys):
    wl, model = workload_dir
    assert evaluate_main(["--workload", str(tmp_path / "nope"), "--model", model]) == 2
    line = one_error_line(capsys.readouterr().err, EVALUATE)
    assert "not a workload folder" in line and "nope" in line
    assert evaluate_main(["--workload", wl, "--model", str(tmp_path / "missing.pt")]) == 2
    assert "missing.pt" in one_error_line(capsys.readouterr().err, EVALUATE)
    # a truncated request file in a copy of the workload: named, nothing written
    import shutil

    copy = str(tmp_path / "wl")
    shutil.copytree(wl, copy)
    req_dir = os.path.join(copy, "requests")
    victim = os.path.join(req_dir, sorted(os.listdir(req_dir))[0])
    data = open(victim, "rb").read()
    open(victim, "wb").write(data[: len(data) // 3])
    assert evaluate_main(["--workload", copy, "--model", model, "--modes", "full"]) == 2
    line = one_error_line(capsys.readouterr().err, EVALUATE)
    assert victim in line and "not a readable Parquet file" in line
    for name in os.listdir(req_dir):
        os.remove(os.path.join(req_dir, name))
    assert evaluate_main(["--workload", copy, "--model", model, "--modes", "full"]) == 2
    assert "holds no request file" in one_error_line(capsys.readouterr().err, EVALUATE)
    assert not os.path.exists(os.path.join(copy, "evaluation.json"))
