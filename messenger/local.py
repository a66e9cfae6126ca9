"""LocalCluster: a broker and N workers as child processes on this machine (`local[N]`).

WHY processes, not threads: the workers run PyTorch and must not share the driver's GIL or die
with it quietly; children are started with `python -m ...` in their own session (so a terminal's
Ctrl-C reaches only the parent, which then stops them in order), log to files in a private
temporary folder (pipes could fill and block them), run a parent-death watchdog (SIGKILL of the
parent leaves nothing behind) and are stopped on context exit, on failure while starting, at
interpreter exit and on Ctrl-C.

Authentication needs no set-up. With the default ipc transport every socket (broker front and
back, each worker's data socket) is a file in the run's 0700 folder, so the kernel admits only
this user's processes: a single-user run, authenticated by the file system, with no encryption
cost on the frames route. With transport="tcp" (reachable by any local user) start() makes a key
set for the run (security.make_full_set) in that folder and starts the broker and workers with
it, and client() dealers use its client key pair; another local user gets nothing through.
`curve=True/False` overrides the choice (True on ipc: defence in depth; False on tcp: loopback
only, for comparing its cost).

Which program a worker runs:
- `worker_argv_factory(index, back_endpoint) -> argv`: anything (it must reach the broker at
  back_endpoint with the run's keys, $SPARKGNN_CURVE_KEYS in its environment, and call
  sparkgnn.messenger.watchdog.start_from_env(); the mains here do);
- else `handler="module:function"`: the generic worker `python -m sparkgnn.messenger.worker
  --handler module:function` (tests use this with a fixture handler; put its module on
  PYTHONPATH via `env=`);
- else the product worker `python -m sparkgnn.worker.cli --device ... --model-store ...`
  (plus `--deployments FILE` when `deployments=` names the file of what its serving ops serve).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from sparkgnn.messenger import security, shm
from sparkgnn.messenger.dealer import MessengerTransport
from sparkgnn.messenger.errors import TransportError
from sparkgnn.messenger.probe import broker_stats
from sparkgnn.messenger.watchdog import ENV as PARENT_ENV

_LOG_TAIL = 3000


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(
        self,
        num_workers: int,
        handler: str | None = None,
        worker_argv_factory: Callable[[int, str], Sequence[str]] | None = None,
        *,
        transport: str = "ipc",
        model_store=None,
        deployments: str | None = None,
        device: str = "cpu",
        threads: int | None = None,
        heartbeat_s: float = 1.0,
        liveness: int = 3,
        slots: int = 2,
        max_queue: int = 1024,
        env: dict | None = None,
        start_timeout_s: float = 60.0,
        metrics_interval_s: float = 10.0,
        python: str = sys.executable,
        curve: bool | None = None,
    ):
        if num_workers < 1:
            raise ValueError("LocalCluster needs at least one worker")
        if transport not in ("ipc", "tcp"):
            raise ValueError(f"transport must be 'ipc' or 'tcp', got {transport!r}")
        self.num_workers = num_workers
        self.handler = handler
        self.worker_argv_factory = worker_argv_factory
        self.transport = transport
        self.model_store = model_store
        self.deployments = deployments
        self.device = device
        self.threads = threads
        self.heartbeat_s = heartbeat_s
        self.liveness = liveness
        self.slots = slots
        self.max_queue = max_queue
        self.extra_env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.metrics_interval_s = metrics_interval_s
        self.python = python
        self.curve = (transport == "tcp") if curve is None else curve
        self.dir: str | None = None
        self.keys_dir: str | None = None  # the run's CURVE keys (curve=True), made by start()
        self.front: str | None = None  # the broker's endpoints, chosen by start()
        self.back: str | None = None
        self.broker: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._logs: dict[int, str] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def _endpoints(self) -> tuple[str, str]:
        """(front, back); set by start()."""
        if self.front is None or self.back is None:
            raise RuntimeError("LocalCluster is not started: call start() or use it in a with statement")
        return self.front, self.back

    def _run_dir(self) -> str:
        """The folder of the children's logs and ipc sockets; made by start(), removed by stop()."""
        if self.dir is None:
            raise RuntimeError("LocalCluster is not running: call start() or use it in a with statement")
        return self.dir

    def start(self) -> LocalCluster:
        self.dir = tempfile.mkdtemp(prefix="sparkgnn-local-")
        if self.curve:
            # Ironhouse with no set-up: a key set of this run, in its 0700 folder, gone with it
            self.keys_dir = security.make_full_set(os.path.join(self.dir, "keys"))
        if self.transport == "ipc":
            self.front, self.back = f"ipc://{self.dir}/front.ipc", f"ipc://{self.dir}/back.ipc"
        else:
            self.front = f"tcp://127.0.0.1:{free_tcp_port()}"
            self.back = f"tcp://127.0.0.1:{free_tcp_port()}"
        atexit.register(self.stop)
        try:
            self.start_broker()
            for index in range(self.num_workers):
                self.workers.append(self._spawn(f"worker{index}", self._worker_argv(index)))
            self.wait_ready(self.num_workers)
        except BaseException:
            self.stop()
            raise
        return self

    def start_broker(self) -> subprocess.Popen:
        """(Re)start the broker on the same endpoints (tests restart it to simulate a crash)."""
        front, back = self._endpoints()
        argv = [
            self.python,
            "-m",
            "sparkgnn.messenger.broker",
            "--front",
            front,
            "--back",
            back,
            "--heartbeat",
            str(self.heartbeat_s),
            "--liveness",
            str(self.liveness),
            "--max-queue",
            str(self.max_queue),
            "--metrics-interval",
            str(self.metrics_interval_s),
        ]
        if self.keys_dir:
            argv += ["--curve-keys", self.keys_dir]
        self.broker = self._spawn("broker", argv)
        return self.broker

    def wait_ready(self, count: int, timeout_s: float | None = None) -> dict:
        """Until the broker reports `count` live workers; raises with the children's logs."""
        front, _ = self._endpoints()
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        metrics: dict = {}
        while time.monotonic() < deadline:
            dead = [p for p in [self.broker, *self.workers] if p is not None and p.poll() is not None]
            if dead:
                raise TransportError(
                    f"local cluster: a child exited with {dead[0].returncode} while starting\n{self.logs()}"
                )
            try:
                metrics = broker_stats(front, timeout_s=1.0, client_keys=self.client_keys())
            except TransportError:
                continue
            if metrics.get("live_workers", 0) >= count:
                return metrics
            time.sleep(0.05)
        raise TransportError(
            f"local cluster: {metrics.get('live_workers', 0)}/{count} workers "
            f"READY after {timeout_s or self.start_timeout_s}s at {front}\n{self.logs()}"
        )

    def stop(self, grace_s: float = 3.0) -> None:
        """Workers first (they send DISCONNECT), then the broker; SIGKILL after grace_s."""
        procs = [p for p in [*self.workers, self.broker] if p is not None]
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.workers, self.broker = [], None
        shm.sweep_stale()  # segments of dealers that died with this cluster
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = self.keys_dir = None
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalCluster:
        return self.start() if self.broker is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------
    def client_keys(self) -> security.ClientKeys | None:
        """The run's client key pair pinning its server key (None with curve=False)."""
        return security.ClientKeys.from_dir(self.keys_dir) if self.keys_dir else None

    def client(self, **options) -> MessengerTransport:
        """A dealer of this cluster, with the run's client keys."""
        options.setdefault("keys_dir", self.keys_dir)
        options.setdefault("heartbeat_s", self.heartbeat_s)
        options.setdefault("liveness", self.liveness)
        front, _ = self._endpoints()
        return MessengerTransport(front, **options)

    def add_worker(self) -> subprocess.Popen:
        proc = self._spawn(f"worker{len(self.workers)}", self._worker_argv(len(self.workers)))
        self.workers.append(proc)
        return proc

    def logs(self) -> str:
        out = []
        for name, path in sorted(self._logs.items()):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - _LOG_TAIL))
                    out.append(f"--- {name} ---\n{f.read().decode(errors='replace')}")
            except OSError:
                pass
        return "\n".join(out)

    def _worker_argv(self, index: int) -> list[str]:
        _, back = self._endpoints()
        if self.worker_argv_factory is not None:
            return list(self.worker_argv_factory(index, back))
        common = [
            "--connect",
            back,
            "--heartbeat",
            str(self.heartbeat_s),
            "--liveness",
            str(self.liveness),
            "--slots",
            str(self.slots),
        ]
        if self.keys_dir:
            common += ["--curve-keys", self.keys_dir]
        if self.handler is not None:
            return [self.python, "-m", "sparkgnn.messenger.worker", *common, "--handler", self.handler]
        if self.model_store is None:
            raise ValueError(
                "LocalCluster needs handler='module:function', worker_argv_factory "
                "or model_store= (for the sparkgnn-worker GNN handler)"
            )
        argv = [
            self.python,
            "-m",
            "sparkgnn.worker.cli",
            *common,
            "--device",
            self.device,
            "--model-store",
            os.fspath(self.model_store),
        ]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        if self.deployments:
            argv += ["--deployments", os.fspath(self.deployments)]
        return argv

    def _spawn(self, name: str, argv: Sequence[str]) -> subprocess.Popen:
        env = dict(os.environ, **self.extra_env)
        env[PARENT_ENV] = str(os.getpid())
        env.setdefault("PYTHONUNBUFFERED", "1")
        run_dir = self._run_dir()
        env.setdefault("SPARKGNN_IPC_DIR", run_dir)
        # children started by worker_argv_factory find the run's keys the same way
        env.pop(security.KEYS_ENV, None)
        if self.keys_dir:
            env[security.KEYS_ENV] = self.keys_dir
        log_path = os.path.join(run_dir, f"{name}.{len(self._logs)}.log")
        self._logs[len(self._logs)] = log_path
        with open(log_path, "wb") as log:
            return subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
