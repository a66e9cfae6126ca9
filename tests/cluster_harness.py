"""Run a sparkgnn job through spark-submit on a multi-process cluster (`local-cluster[2,1,1024]`:
a standalone master, a worker and two executor JVMs on this machine, as on a real cluster) and
SIGKILL an executor when a trigger fires: a line the job prints, or a path appearing in its work
dir (a step's first file: the kill then lands mid-step, while other tasks of the step still run).

Why paths: a step of a test graph lasts about a second, so a kill timed on the progress lines can
only land between steps; the files a step's tasks write say when it is under way.

`run_job` submits a job as an application of its own; `SharedCluster` runs several jobs in turn in
one application (tests/cluster_jobserver.py), so a test module's jobs start the cluster once.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from sparkgnn.engine import cds

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
# The executors run Spark's class path, so they map the class-data archive too (engine.cds), and
# fork their Python workers from sparkgnn's daemon, as a local session does (sparkgnn.pydaemon).
JAVA_OPTIONS = f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {cds.java_options()}".strip()
CLUSTER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.extraJavaOptions": JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": JAVA_OPTIONS,
    "spark.python.daemon.module": "sparkgnn.pydaemon",
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


#: One line reader per process (by pid): the shared cluster's output is read across several jobs.
_READERS: dict[int, _Lines] = {}


def _submit(script_path: str, args: list[str], cwd: str, conf: dict | None) -> subprocess.Popen:
    """spark-submit `script_path` with `args` on MASTER in `cwd`; output (stdout and stderr) on a pipe."""
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYTHONUNBUFFERED", None)  # the job must flush its progress lines itself
    command = [spark_submit, "--master", MASTER]
    for key, value in {**CLUSTER_CONF, **(conf or {})}.items():
        command += ["--conf", f"{key}={value}"]
    command += [script_path, *args]
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip


class _Lines:
    """The lines a process writes to a pipe, read without blocking longer than asked. (A text file's
    readline after select() can pull several lines into its own buffer, where select() no longer
    sees them: a process that then waits, as the shared cluster's driver does between jobs, would
    keep its last lines hidden.)"""

    def __init__(self, stream) -> None:
        self.fd = stream.fileno()
        self.buffer = b""
        self.eof = False

    def next(self, timeout_s: float) -> str | None:
        """The next whole line; None if none came within `timeout_s`; "" once the pipe is closed
        and drained."""
        while b"\n" not in self.buffer:
            if self.eof:
                line, self.buffer = self.buffer, b""
                return line.decode(errors="replace")
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
            if not ready:
                return None
            data = os.read(self.fd, 1 << 16)
            self.eof = not data
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode(errors="replace") + "\n"


def _follow(job: subprocess.Popen, cwd: str, kills: list[Kill], log, until: str | None = None,
            kill_driver_on: str | None = None) -> tuple[str, list[str]]:  # fmt: skip
    """Read the job's lines (into `log`, with their second since the call) and fire each due Kill
    on one of this job's executors (descendants of `job`), until its output ends ("eof"), a line
    starts with `until` ("until", that line last), `kill_driver_on` appears ("driver killed": the
    whole process group SIGKILLed, as a lost driver node would be) or JOB_TIMEOUT_S passes ("timeout")."""
    lines: list[str] = []
    reader = _READERS.setdefault(job.pid, _Lines(job.stdout))
    started = time.monotonic()
    while time.monotonic() < started + JOB_TIMEOUT_S:
        line = reader.next(0.02)
        if line == "":
            return "eof", lines
        if line and not line.startswith("\tat "):  # keep the job's lines and log lines, not stacks
            lines.append(line)
            log.write(f"{time.monotonic() - started:8.2f} {line}")
        if until is not None and line and line.startswith(until):
            return "until", lines
        for kill in kills:
            if kill.due(cwd, line):
                mine = [pid for pid in executor_pids() if pid in _children(job.pid)]
                if mine:
                    os.kill(mine[0], signal.SIGKILL)
                    kill.fired_at = (line or kill.path or "").strip()
        if kill_driver_on is not None and line and kill_driver_on in line:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(60)
            return "driver killed", lines
    return "timeout", lines


def _log(cwd: str, script: str):
    """The job's lines with their second since submit, next to the job: where a slow or failed run
    spent its time."""
    return open(os.path.join(cwd, f"spark-submit-{os.path.splitext(script)[0]}.log"), "a")


def run_job(
    script: str,
    args: list[str],
    cwd,
    kills: list[Kill] = (),  # type: ignore[assignment]
    conf: dict | None = None,
    kill_driver_on: str | None = None,
) -> JobRun:
    """spark-submit `spark_jobs/<script>` with `args` in `cwd` as an application of its own; fire
    each Kill once (on this job's own executors: descendants of the spark-submit process).
    `kill_driver_on`: SIGKILL the whole job (driver and cluster) when that line appears, as a lost
    driver node would."""
    cwd = str(cwd)
    job = _submit(os.path.join(REPO, "spark_jobs", script), args, cwd, conf)
    kills = list(kills)
    try:
        with _log(cwd, script) as log:
            how, lines = _follow(job, cwd, kills, log, kill_driver_on=kill_driver_on)
        if how == "driver killed":
            return JobRun(-signal.SIGKILL, lines, kills)
        returncode = job.wait(60)
    finally:
        _READERS.pop(job.pid, None)
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(60)
    return JobRun(returncode, lines, kills)


def _open_writer(pipe: str, reader: subprocess.Popen, timeout_s: float = 60.0):
    """The write end of the named pipe `pipe`, once `reader` has opened its end (never waiting
    without a bound: a reader that died or never opens it is an error)."""
    import errno

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and reader.poll() is None:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(fd, True)
        return os.fdopen(fd, "w")
    raise RuntimeError(f"the shared cluster's driver never opened its job pipe {pipe}")


class SharedCluster:
    """One spark-submit application on MASTER that runs several jobs in turn (tests/cluster_jobserver.py):
    the cluster's JVMs and Python workers start once for all of a test module's jobs. `run` has
    run_job's contract, less `conf` and `kill_driver_on` (those need an application of their own).
    A job that times out takes the application down; the next `run` starts a new one."""

    def __init__(self, cwd) -> None:
        self.cwd = str(cwd)
        self.app: subprocess.Popen | None = None
        self.jobs = None  # the write end of the server's job pipe
        self.started = 0

    def _start(self) -> subprocess.Popen:
        from cluster_jobserver import READY

        self.started += 1
        pipe = os.path.join(self.cwd, f"jobs-{self.started}.fifo")
        os.mkfifo(pipe, 0o600)
        app = _submit(os.path.join(REPO, "tests", "cluster_jobserver.py"), [pipe], self.cwd, None)
        with _log(self.cwd, "cluster_jobserver") as log:
            how, lines = _follow(app, self.cwd, [], log, until=READY)
        if how != "until":
            self._kill(app)
            raise RuntimeError(f"the shared cluster did not start ({how}): {''.join(lines)[-4000:]}")
        self.jobs = _open_writer(pipe, app)  # the server opens its end right after READY
        return app

    def run(self, script: str, args: list[str], cwd, kills: list[Kill] = ()) -> JobRun:  # type: ignore[assignment]
        from cluster_jobserver import DONE

        cwd = str(cwd)
        if self.app is None or self.app.poll() is not None:
            self.app = self._start()
        kills = list(kills)
        self.jobs.write(json.dumps({"script": script, "args": list(args), "cwd": cwd}) + "\n")
        self.jobs.flush()
        with _log(cwd, script) as log:
            how, lines = _follow(self.app, cwd, kills, log, until=DONE)
        if how != "until":  # timed out or the application died: nothing of it is reused
            self.close()
            return JobRun(-1, lines, kills)
        return JobRun(int(lines.pop().split()[-1]), lines, kills)

    @staticmethod
    def _kill(app: subprocess.Popen) -> None:
        _READERS.pop(app.pid, None)
        if app.poll() is None:
            os.killpg(app.pid, signal.SIGKILL)
        app.wait(60)

    def close(self) -> None:
        if self.jobs is not None:
            self.jobs.close()  # the server's loop ends; spark-submit stops the cluster
            self.jobs = None
        if self.app is not None:
            # read what the application writes while it stops (its shutdown logs share the pipe with
            # stdout): a full pipe would block its exit until the deadline below
            reader = _READERS.setdefault(self.app.pid, _Lines(self.app.stdout))
            deadline = time.monotonic() + 60
            while self.app.poll() is None and time.monotonic() < deadline:
                if reader.eof:
                    try:
                        self.app.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
                else:
                    reader.next(timeout_s=0.5)
            self._kill(self.app)
            self.app = None
