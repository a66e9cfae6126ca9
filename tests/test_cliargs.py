"""sparkgnn.cliargs: numbers are checked by argparse, user errors print one line and exit 2."""

import argparse
import errno

import pytest

from sparkgnn.cliargs import int_list, non_negative_int, positive_float, positive_int, run_cli
from sparkgnn.errors import PlanError, SparkGNNError
from sparkgnn.messenger.errors import BrokerUnreachableError


def _parser():
    p = argparse.ArgumentParser(prog="tool")
    p.add_argument("--n", type=positive_int)
    p.add_argument("--k", type=non_negative_int)
    p.add_argument("--fanouts", type=int_list(1))
    p.add_argument("--gamma", type=positive_float)
    return p


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n", "0"], "argument --n: must be >= 1, got 0"),
        (["--n", "x"], "argument --n: must be an integer, got 'x'"),
        (["--k", "-1"], "argument --k: must be >= 0, got -1"),
        (["--fanouts", "a,b"], "argument --fanouts: 'a,b': 'a' must be an integer"),
        (["--fanouts", "25,0"], "argument --fanouts: '25,0': '0' must be >= 1"),
        (["--fanouts", ","], "argument --fanouts: needs at least one integer"),
        (["--gamma", "nan"], "argument --gamma: must be a finite number > 0"),
    ],
)
def test_bad_numbers_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_good_numbers_parse():
    args = _parser().parse_args(["--n", "3", "--k", "0", "--fanouts", "25, 10", "--gamma", "0.5"])
    assert (args.n, args.k, args.fanouts, args.gamma) == (3, 0, [25, 10], 0.5)


@pytest.mark.parametrize(
    "error, line",
    [
        (SparkGNNError("the store is stale"), "tool: error: the store is stale"),
        # the standalone leaves' own error bases (sparkgnn.errors.USER_ERRORS)
        (PlanError("unknown strategy 'fastest'"), "tool: error: unknown strategy 'fastest'"),
        (BrokerUnreachableError("no broker answered at tcp://h:1"), "tool: error: no broker answered at tcp://h:1"),
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/out/part-0"),
            "tool: error: No space left on device: /data/out/part-0",
        ),
        (PermissionError(errno.EACCES, "Permission denied", "/ro/out"), "tool: error: Permission denied: /ro/out"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(capsys, error, line):
    def body():
        raise error

    assert run_cli("tool", body) == 2
    assert capsys.readouterr().err.strip() == line


def test_bugs_keep_their_traceback():
    def body():
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run_cli("tool", body)


def test_a_jvm_disk_error_is_one_line(capsys):
    class Py4JJavaError(Exception):
        """Stands in for py4j's class of the same name (matched by name, like the real one)."""

    text = (
        "An error occurred while calling o123.parquet.\n: org.apache.spark.SparkException: Job aborted.\n"
        "Caused by: java.io.IOException: No space left on device\n\tat java.base/..."
    )

    def body():
        raise Py4JJavaError(text)

    assert run_cli("tool", body) == 2
    assert (
        capsys.readouterr().err.strip()
        == "tool: error: Spark could not write: Caused by: java.io.IOException: No space left on device"
    )


def test_progress_lines_reach_a_pipe_as_they_are_printed():
    # The command prints a line and then waits for its parent: with stdout a pipe (as under
    # spark-submit) the parent must see the line before the command ends.
    import os
    import select
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        from sparkgnn.cliargs import run_cli

        def main():
            print("sparkgnn layer 1/2: done")
            sys.stdin.readline()  # the parent answers only after it has read the line

        sys.exit(run_cli("probe", main))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # as a cluster manager runs it
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the progress line was held in the pipe's buffer"
        assert proc.stdout.readline().strip() == "sparkgnn layer 1/2: done"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
