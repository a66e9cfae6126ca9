"""procgc.freeze_startup_objects: once per process, later full collections skip the frozen
objects yet still free cycles created after the freeze."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

from sparkgnn import procgc


class _Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_freeze_once_and_later_cycles_are_still_collected():
    procgc.freeze_startup_objects()
    assert procgc.freeze_startup_objects() is False  # once per process
    assert gc.get_freeze_count() > 0
    cycle = _Node()
    ref = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert ref() is None  # created after the freeze: collected as before


_PROBE = """
import gc
from sparkgnn import procgc
class Node:
    pass
before = Node()
assert procgc.freeze_startup_objects()
after = Node()
walked = gc.get_objects()
print(any(o is before for o in walked), any(o is after for o in walked))
"""


def test_objects_alive_at_the_freeze_are_out_of_the_collectors_walks():
    """In a fresh process: what a full collection walks (gc.get_objects, the tracked generations)
    no longer holds an object alive at the freeze, and holds one created after it."""
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "True"]
