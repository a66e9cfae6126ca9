"""Helpers shared by the messenger tests. A uniquely named module: `from conftest import ...`
resolves to whichever tests/**/conftest.py was imported first in a full run."""

import time

HB = 0.05  # heartbeat for tests: expiry after 3 x 50 ms


def wait_for(predicate, timeout=10.0, interval=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
