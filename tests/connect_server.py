"""Start a Spark Connect server for tests and hand out its `sc://` URL.

Why: Spark 4's standard client is Spark Connect, and a Connect session has no sparkContext, no
accumulators and no py4j gateway, so the engine must be tested through a real server. The server
is the one pyspark ships (sbin/start-connect-server.sh, jars/spark-connect_2.13-*.jar), bound to
loopback on a free port. Its log, pid file and ident string live in a temp dir of its own, so
parallel test processes (pytest-xdist) never find each other's pid file ("running as process N.
Stop it first") or rotate each other's logs. The server's Python workers run this interpreter
(PYSPARK_PYTHON), so they import sparkgnn and pyarrow like the tasks of a classic session.

Use:
    with connect_server() as url:
        spark = SparkSession.builder.remote(url).getOrCreate()

(`ConnectServer` is the same as an object: `.url`, `.start_seconds`, `.log_dir`.)

or run `python tests/connect_server.py` to start one, print its URL and start time, and stop it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from sparkgnn.messenger.watchdog import pid_alive

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

# Server-wide settings of a test server: the ones engine.session.LOCAL_CONF gives a local classic
# session that cannot be set from a client (a Connect client sets only runtime SQL confs).
SERVER_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.connect.grpc.binding.address": "127.0.0.1",  # loopback only: Connect does not authenticate
    "spark.driver.memory": "2g",
    "spark.python.worker.reuse": "true",
    "spark.shuffle.compress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


class ConnectServerError(RuntimeError):
    """The server did not come up (the message carries the tail of its log)."""


def spark_home() -> str:
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int | None) -> bool:
    if pid is None or not pid_alive(pid):
        return False
    # a zombie (our own child that exited) counts as dead
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _log_tail(log_dir: str, lines: int = 40) -> str:
    texts = []
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), errors="replace") as fh:
            texts.append(f"--- {name}\n" + "".join(fh.readlines()[-lines:]))
    return "\n".join(texts) or "(no log written)"


class ConnectServer:
    """One server process: `start()` returns once it accepts connections, `stop()` ends it."""

    def __init__(self, master: str = "local[2]", conf: dict | None = None, timeout_s: float = 180.0):
        self.master = master
        self.conf = {**SERVER_CONF, **(conf or {})}
        self.timeout_s = timeout_s
        self.home = spark_home()
        self.root = tempfile.mkdtemp(prefix="sparkgnn-connect-")
        self.port: int | None = None
        self.pid: int | None = None
        self.start_seconds: float | None = None
        self.env = dict(
            os.environ,
            SPARK_HOME=self.home,
            SPARK_LOG_DIR=os.path.join(self.root, "logs"),
            SPARK_PID_DIR=os.path.join(self.root, "pids"),
            SPARK_IDENT_STRING=f"sparkgnn-test-{os.getpid()}",
            PYSPARK_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
        )
        self.env.pop("PYSPARK_GATEWAY_PORT", None)  # never attach to a classic session's gateway
        self.env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        self.env.pop("SPARK_REMOTE", None)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_dir(self) -> str:
        return self.env["SPARK_LOG_DIR"]

    def _pid_file(self) -> str:
        return os.path.join(self.env["SPARK_PID_DIR"], f"spark-{self.env['SPARK_IDENT_STRING']}-{SERVER_CLASS}-1.pid")

    def _read_pid(self) -> int | None:
        try:
            with open(self._pid_file()) as fh:
                return int(fh.read().strip())
        except (OSError, ValueError):
            return None

    def start(self) -> str:
        started = time.perf_counter()
        self.port = free_port()
        conf = dict(
            self.conf,
            **{
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(self.port),
                # fail instead of silently binding port+1, which this helper would not be polling
                "spark.connect.grpc.port.maxRetries": "0",
            },
        )
        args = [os.path.join(self.home, "sbin", "start-connect-server.sh"), "--master", self.master]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        # The script writes the pid file at once, then sleeps ~2.5 s to check the JVM lives; poll
        # the port meanwhile instead of waiting for it.
        script = subprocess.Popen(args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + self.timeout_s
        while True:
            self.pid = self.pid or self._read_pid()
            if self.pid is not None and _accepts(self.port):
                break
            script_done = script.poll() is not None
            if script_done and (self.pid is None or not _alive(self.pid)):
                output = script.stdout.read() if script.stdout else ""
                self.stop()
                raise ConnectServerError(f"Spark Connect server did not start:\n{output}\n{_log_tail(self.log_dir)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ConnectServerError(
                    f"Spark Connect server not accepting on {self.port} after {self.timeout_s:.0f} s:\n"
                    + _log_tail(self.log_dir)
                )
            time.sleep(0.1)
        self.start_seconds = time.perf_counter() - started
        with contextlib.suppress(subprocess.TimeoutExpired):
            script.wait(timeout=10)
        return self.url

    def stop(self, timeout_s: float = 20.0) -> None:
        """stop-connect-server.sh (SIGTERM to the pid in our pid file), then SIGKILL if the JVM is
        still there after `timeout_s`; the temp dir goes last."""
        pid = self.pid or self._read_pid()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [os.path.join(self.home, "sbin", "stop-connect-server.sh")],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
            )
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pid = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ConnectServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def connect_server(master: str = "local[2]", conf: dict | None = None, timeout_s: float = 180.0):
    """Yield the `sc://127.0.0.1:PORT` URL of a fresh server; stop it afterwards."""
    with ConnectServer(master, conf, timeout_s) as server:
        yield server.url


if __name__ == "__main__":
    with ConnectServer() as srv:
        print(f"{srv.url} accepted connections after {srv.start_seconds:.1f} s")
