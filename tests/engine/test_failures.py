"""engine.failures: a step's Spark error becomes one line naming the step, what was lost and what a
rerun does; sparkgnn's own refusals pass through; only losses keep the run for a resume."""

import pytest

from sparkgnn.engine.failures import failed_step, failure_detail, lost_resource, resume_command, step_failures
from sparkgnn.engine.run_dir import RunDir
from sparkgnn.errors import GraphValidationError, LayerFailed

# The shape of Spark's error when an executor dies beyond the task's retries (Py4JJavaError text).
EXECUTOR_LOST = (
    "An error occurred while calling o412.parquet.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 2 in stage 31.0 failed 4 "
    "times, most recent failure: Lost task 2.3 in stage 31.0 (TID 97) (127.0.0.1 executor 3): "
    "ExecutorLostFailure (executor 3 exited caused by one of the running tasks) Reason: Command exited "
    "with code 137\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2935)"
)
# A Python task's own error, as PythonException shows it.
TASK_ERROR = (
    "An exception was thrown from the Python worker. Please see the stack trace below.\n"
    "Traceback (most recent call last):\n"
    '  File "steps.py", line 10, in run_step\n'
    "sparkgnn.engine.steps.StepFailed: layer step 1/2 failed in partition 1: table 'mirror' holds NaN/Inf values"
)


class FakeExchange:
    def __init__(self, run, durable=True):
        self.run = run
        self.durable = durable


def test_the_lost_part_of_a_spark_error_is_found():
    assert lost_resource(Exception(EXECUTOR_LOST)).startswith("Task 2 in stage 31.0 failed 4 times")
    assert "ExecutorLostFailure (executor 3" in lost_resource(Exception(EXECUTOR_LOST))
    assert lost_resource(Exception(TASK_ERROR)) is None
    assert failure_detail(Exception(TASK_ERROR)).startswith("sparkgnn.engine.steps.StepFailed: layer step 1/2")


def test_a_loss_after_a_committed_step_says_where_the_rerun_resumes(tmp_path):
    run = RunDir(str(tmp_path), "k")
    run.make_step(0)
    run.commit(0, {})
    error = failed_step("layer 2/2: replicate", Exception(EXECUTOR_LOST), FakeExchange(run), True, ["scan"].__getitem__)
    text = str(error)
    assert text.startswith("sparkgnn layer 2/2: replicate failed: Task 2 in stage 31.0 failed 4 times")
    assert "ExecutorLostFailure" in text and "\n" not in text
    assert f"kept in {run.path}" in text and "resume after 'scan'" in text
    assert error.run_path == run.path and error.label == "layer 2/2: replicate"


@pytest.mark.parametrize(
    "durable, resumable, committed, expected",
    [
        (True, True, False, "no step of this run had finished"),
        (False, True, True, "keeps no steps (local materialisation)"),
        (True, False, True, "rerun the same command to start again"),  # precompute: its store resumes
    ],
)
def test_what_a_rerun_does_when_nothing_is_kept(tmp_path, durable, resumable, committed, expected):
    run = RunDir(str(tmp_path), "k")
    if committed:
        run.make_step(0)
        run.commit(0, {})
    error = failed_step("layer 1/2: replicate", Exception(EXECUTOR_LOST), FakeExchange(run, durable), resumable)
    assert expected in str(error) and error.run_path is None


def test_a_deterministic_task_error_keeps_nothing_and_says_so(tmp_path):
    run = RunDir(str(tmp_path), "k")
    run.make_step(0)
    run.commit(0, {})
    error = failed_step("layer 2/2: replicate", Exception(TASK_ERROR), FakeExchange(run), True)
    assert "holds NaN/Inf values" in str(error) and "nothing was lost" in str(error)
    assert error.run_path is None


def test_refusals_pass_through_and_other_errors_are_named(tmp_path):
    with pytest.raises(GraphValidationError):
        with step_failures("layer 1/2: replicate", FakeExchange(None, False), True):
            raise GraphValidationError("bad graph")
    with pytest.raises(LayerFailed, match="sparkgnn layer 1/2: replicate failed: Task 2 in stage") as caught:
        with step_failures("layer 1/2: replicate", FakeExchange(None, False), True):
            raise RuntimeError(EXECUTOR_LOST)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_the_resume_command_names_the_work_dir():
    command = resume_command("batch_inference.py", ["--graph", "g", "--out", "o"], "/w/runs/abc")
    assert command == "spark-submit [your Spark options] batch_inference.py --graph g --out o --work-dir /w"
    kept = resume_command("batch_inference.py", ["--work-dir", "w"], "/abs/w/runs/abc")
    assert kept.endswith("batch_inference.py --work-dir w")
