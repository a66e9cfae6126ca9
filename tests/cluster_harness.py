"""Run a sparkgnn job through spark-submit on a multi-process cluster (`local-cluster[2,1,1024]`:
a standalone master, a worker and two executor JVMs on this machine, as on a real cluster) and
SIGKILL an executor when a trigger fires: a line the job prints, or a path appearing in its work
dir (a step's first file: the kill then lands mid-step, while other tasks of the step still run).

Why paths: a step of a test graph lasts about a second, so a kill timed on the progress lines can
only land between steps; the files a step's tasks write say when it is under way.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB_TIMEOUT_S = 420
MASTER = "local-cluster[2,1,1024]"
# No UI; and the graphs here are Cora-sized, so Spark's default 200 shuffle partitions only add
# tasks (five 200-task stages were most of a 90 s precompute run); the jobs keep spark-submit's
# other settings, as a user's would.
# The jobs' JVMs (driver, executors and the ones a worker relaunches) take the options tests/conftest.py
# gives every test driver (C1 only, one GC thread): on a 2-core machine C2's compiler threads and
# G1's parallel workers were half the CPU a job's JVMs burned, and executors were slow to register
# while another test ran beside them. What the jobs compute is the same.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
CLUSTER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.extraJavaOptions": JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": JAVA_OPTIONS,
}


@dataclass
class Kill:
    """SIGKILL one executor when `line` appears in the job's output or `path` (a glob relative to
    the job's cwd) matches a file or directory."""

    line: str | None = None
    path: str | None = None
    fired_at: str | None = field(default=None, init=False)

    def due(self, cwd: str, new_line: str | None) -> bool:
        if self.fired_at is not None:
            return False
        if self.line is not None and new_line is not None and self.line in new_line:
            return True
        return self.path is not None and bool(glob.glob(os.path.join(cwd, self.path), recursive=True))


@dataclass
class JobRun:
    returncode: int
    lines: list
    kills: list

    def output(self) -> str:
        return "".join(self.lines)


def executor_pids() -> list[int]:
    """Executor JVMs of every local-cluster on this machine (CoarseGrainedExecutorBackend)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"CoarseGrainedExecutorBackend" in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def _children(pid: int) -> set[int]:
    """Every descendant of `pid` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def run_job(
    script: str,
    args: list[str],
    cwd,
    kills: list[Kill] = (),  # type: ignore[assignment]
    conf: dict | None = None,
    kill_driver_on: str | None = None,
) -> JobRun:
    """spark-submit `spark_jobs/<script>` with `args` in `cwd`; fire each Kill once (on this job's
    own executors: descendants of the spark-submit process). `kill_driver_on`: SIGKILL the whole
    job (driver and cluster) when that line appears, as a lost driver node would."""
    cwd = str(cwd)
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYTHONUNBUFFERED", None)  # the job must flush its progress lines itself
    command = [spark_submit, "--master", MASTER]
    for key, value in {**CLUSTER_CONF, **(conf or {})}.items():
        command += ["--conf", f"{key}={value}"]
    command += [os.path.join(REPO, "spark_jobs", script), *args]
    job = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    kills = list(kills)
    lines: list[str] = []
    started = time.monotonic()
    deadline = started + JOB_TIMEOUT_S
    # every line with its second since submit, next to the job: where a slow or failed run spent its time
    log = open(os.path.join(cwd, f"spark-submit-{os.path.splitext(script)[0]}.log"), "a")
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([job.stdout], [], [], 0.02)
            line = job.stdout.readline() if ready else None
            if ready and not line:
                break
            if line and not line.startswith("\tat "):  # keep the job's lines and log lines, not stacks
                lines.append(line)
                log.write(f"{time.monotonic() - started:8.2f} {line}")
            for kill in kills:
                if kill.due(cwd, line):
                    mine = [pid for pid in executor_pids() if pid in _children(job.pid)]
                    if mine:
                        os.kill(mine[0], signal.SIGKILL)
                        kill.fired_at = (line or kill.path or "").strip()
            if kill_driver_on is not None and line and kill_driver_on in line:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(60)
                return JobRun(-signal.SIGKILL, lines, kills)
        returncode = job.wait(60)
    finally:
        log.close()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(60)
    return JobRun(returncode, lines, kills)
