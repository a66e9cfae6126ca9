"""Parent-death watchdog for messenger child processes.

WHY polling getppid: LocalCluster starts the broker and workers as children; if the parent dies
hard (SIGKILL, OOM) nothing else would stop them. PR_SET_PDEATHSIG fires when the *thread* that
forked exits, which kills children early when a cluster is started from a worker thread, so a
daemon thread polls instead: when the recorded parent is gone the child exits at once.
LocalCluster passes the parent pid in SPARKGNN_PARENT_PID; every entry point calls
`start_from_env()`.
"""

from __future__ import annotations

import os
import threading

ENV = "SPARKGNN_PARENT_PID"


def pid_alive(pid: int) -> bool:
    """Whether a process exists (signal 0; a process owned by another user still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent_alive(pid: int) -> bool:
    return os.getppid() == pid and pid_alive(pid)


def start(parent_pid: int, interval_s: float = 0.5) -> threading.Thread:
    def watch():
        stop = threading.Event()
        while not stop.wait(interval_s):
            if not _parent_alive(parent_pid):
                os._exit(3)

    thread = threading.Thread(target=watch, name="sparkgnn-parent-watchdog", daemon=True)
    thread.start()
    return thread


def start_from_env() -> threading.Thread | None:
    value = os.environ.get(ENV)
    return start(int(value)) if value else None
