"""A step that fails on the cluster, said in one line: which layer, what was lost, how to resume.

WHY: when an executor died beyond Spark's retries the user got a raw Py4J traceback of several
hundred lines, naming an RDD block, not the layer, and nothing said whether anything was saved.
`step_failures` turns a Spark-side failure of a step into `LayerFailed`, whose message names the
step ("layer 2/2: replicate"), the line of Spark's error that says what was lost (an executor, a
shuffle output, a checkpoint block, a crashed Python worker), and what a rerun does: resume after
the last committed step (engine.run_dir) when the run keeps its steps, start over when it cannot.

Only lost resources keep the run's steps for a rerun: a deterministic failure (a refusal raised in
a task, NaN payloads) would fail the same way again, so its steps are deleted as before. sparkgnn's
own refusals and OS errors raised on the driver (a full disk) pass through unchanged: they already
say what is wrong.
"""

from __future__ import annotations

import re
import shlex
from contextlib import contextmanager

from sparkgnn.errors import USER_ERRORS, LayerFailed

# Phrases of Spark's errors when something a step needed went away rather than computed wrongly.
LOSS_PHRASES = (
    "ExecutorLostFailure",
    "FetchFailed",
    "checkpointRDDBlockIdNotFound",
    "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND",
    "BlockNotFound",
    "Executor heartbeat timed out",
    "Python worker exited unexpectedly",
    "Connection reset by peer",
    "executor lost",
    "Executor lost",
    "SparkContext was shut down",
)
MAX_DETAIL = 400
PASS_THROUGH: tuple[type[BaseException], ...] = (*USER_ERRORS, OSError)
# The last line of a Python traceback: "ValueError: ..." or "sparkgnn.engine.steps.StepFailed: ...".
_PYTHON_ERROR_LINE = re.compile(r"^(\w*(Error|Exception)|([a-z_]\w*\.)+[A-Z]\w*): ")


def lost_resource(exc: BaseException) -> str | None:
    """The line of a Spark error that says what was lost, or None when nothing was."""
    for line in str(exc).splitlines():
        if any(phrase in line for phrase in LOSS_PHRASES):
            return _trim(_from_phrase(line))
    return None


_SPARK_PREAMBLE = re.compile(r"^[:\s]*([\w.]+(Exception|Error): )?(Job aborted due to stage failure: )?")


def _from_phrase(line: str) -> str:
    """The line without Spark's exception class and "Job aborted due to stage failure:" preamble,
    cut to start at the loss phrase when it is too long to keep whole."""
    line = _SPARK_PREAMBLE.sub("", line)
    if len(line) > MAX_DETAIL:
        line = line[min(line.find(p) for p in LOSS_PHRASES if p in line) :]
    return line.strip()


def failure_detail(exc: BaseException) -> str:
    """One line saying why a step failed: the loss, else a Python task's own error line, else the
    first line of the error."""
    lost = lost_resource(exc)
    if lost:
        return lost
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    python_errors = [line for line in lines if _PYTHON_ERROR_LINE.match(line)]
    if python_errors:
        return _trim(python_errors[-1])
    return _trim(lines[0]) if lines else type(exc).__name__


def _trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


@contextmanager
def step_failures(label: str, exchange, resumable: bool, committed_label=None):
    """Run a step's Spark job; a failure that is not one of sparkgnn's refusals becomes LayerFailed
    (module doc). `resumable`: a rerun could resume from this run's kept steps (batch inference;
    PE precomputation resumes from its store instead). `committed_label(index)`: the label of a
    committed step, for the message."""
    try:
        yield
    except PASS_THROUGH:  # they already say what is wrong (a driver-side disk error: cliargs)
        raise
    except Exception as exc:
        raise failed_step(label, exc, exchange, resumable, committed_label) from exc


def failed_step(label: str, exc: BaseException, exchange, resumable: bool, committed_label=None) -> LayerFailed:
    lost = lost_resource(exc)
    run = getattr(exchange, "run", None)
    durable = bool(getattr(exchange, "durable", False)) and run is not None
    kept = run.last_committed() if lost and resumable and run is not None and durable else None
    if kept is not None and run is not None:
        after = f" after '{committed_label(kept)}'" if committed_label else ""
        then = (
            f"the steps before it are kept in {run.path}: rerun the same command with the same work dir "
            f"to resume{after}"
        )
    elif lost and durable:
        then = "no step of this run had finished: rerun the same command to start again"
    elif lost:
        then = "this run keeps no steps (local materialisation): rerun the same command to start again"
    else:
        then = "nothing was lost: fix the cause before rerunning"
    what = lost or failure_detail(exc)
    return LayerFailed(
        f"sparkgnn {label} failed: {what}; {then}",
        label=label,
        lost=lost,
        run_path=run.path if kept is not None and run is not None else None,
    )


def resume_command(script: str, argv: list[str], run_path: str) -> str:
    """The command line that resumes a failed job: the same arguments, with the work dir that holds
    `run_path` (<work>/runs/<key>) named explicitly so the rerun finds it."""
    work_dir = run_path.rstrip("/").rsplit("/", 2)[0]
    args = list(argv)
    if "--work-dir" not in args and not any(a.startswith("--work-dir=") for a in args):
        args += ["--work-dir", work_dir]
    return "spark-submit [your Spark options] " + shlex.join([script, *args])
