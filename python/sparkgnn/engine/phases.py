"""Where a job's wall time went: named phases on one clock, the rest reported as "unaccounted".

WHY: a cold job costs more than its layers (the JVM and session start, reading and checking the
graph, its fingerprint, prepare, the model store, the output commit, shutdown), and a report that
lists only some of them hides where the rest went. A PhaseClock charges every second between its
start and now to exactly one named phase or to "unaccounted": phases nest, and time inside an
inner phase counts for the inner one only (the outer gets the time spent outside its inner
phases), so the phases and the unaccounted time add up to the wall time, and a large unaccounted
share says a phase is missing.

Library code marks its phases with the module-level `phase(name)`, which charges the clock active
in this context (`activate`, a context variable) and does nothing without one: a Spark task or a
caller that wants no table pays one lookup. `infer` runs under `job_clock()`, which uses the
caller's active clock or starts one for the call, so its result always carries the table
(JobResult.phases); `precompute` and `refresh` charge their phases to a caller's active clock.
A job script starts its clock at the process's start (`process_start_time`), so the
interpreter's start and the imports are its first phase.

Thread safety: each thread has its own stack of open phases and the tables are updated under a
lock. Jobs that run side by side on driver threads (a typed round's relation jobs, engine.typed)
each charge a `fork` of the clock, and the caller `absorb`s the forks into the phase it ran them
in: their seconds overlap each other and that phase's wall time, so they are kept as that phase's
detail (summary()["inside"]) and not added to the table, which still adds up to the wall time.

Each phase that ends logs one progress line (INFO; under 0.05 s at DEBUG) unless it is `quiet`
(the steps, which print a richer line of their own); `lines()` is the table a job prints at the end.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

UNACCOUNTED = "unaccounted"
# Phases shorter than this log their progress line at DEBUG: a table entry is enough for them.
QUIET_BELOW_S = 0.05

_ACTIVE: contextvars.ContextVar[PhaseClock | None] = contextvars.ContextVar("sparkgnn_phase_clock", default=None)


@dataclass
class _Open:
    """A phase in progress: its name, when it (re)started charging, when it was entered."""

    name: str
    resumed: float
    entered: float
    quiet: bool
    own: float = 0.0  # seconds charged to it before its latest pause


class PhaseClock:
    """Wall time since `started_at` split into named phases (see the module).

    `started_at` is an epoch time (time.time()'s scale, e.g. `process_start_time()`); None starts
    the clock now. Intervals are measured with time.perf_counter, so a wall-clock adjustment during
    the job moves nothing but the origin."""

    def __init__(self, *, started_at: float | None = None) -> None:
        now = time.perf_counter()
        before = 0.0 if started_at is None else max(time.time() - float(started_at), 0.0)
        self._origin = now - before
        self._last = self._origin  # where the time nothing has charged yet begins (claim)
        self._seconds: dict[str, float] = {}
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stacks = threading.local()  # each thread's open phases
        self._main: list[_Open] = self._stack  # the creating thread's: summary() reports its open phase
        self._inside: dict[str, dict[str, list[float]]] = {}  # absorbed forks: phase -> name -> [s, calls]

    @property
    def _stack(self) -> list[_Open]:
        stack = getattr(self._stacks, "open", None)
        if stack is None:
            stack = self._stacks.open = []
        return stack

    def _charge(self, name: str, seconds: float) -> None:
        with self._lock:
            self._seconds[name] = self._seconds.get(name, 0.0) + max(seconds, 0.0)

    @contextlib.contextmanager
    def phase(self, name: str, *, quiet: bool = False) -> Iterator[None]:
        """Charge the wall time inside the block to `name` (less the time of phases nested in it).
        A name used again adds to the same entry (`calls` counts the uses)."""
        if not name or name == UNACCOUNTED:
            raise ValueError(f"a phase needs a name other than {UNACCOUNTED!r}, got {name!r}")
        now = time.perf_counter()
        stack = self._stack
        if stack:  # pause the enclosing phase
            outer = stack[-1]
            self._charge(outer.name, now - outer.resumed)
            outer.own += now - outer.resumed
        with self._lock:
            self._calls[name] = self._calls.get(name, 0) + 1
            self._seconds.setdefault(name, 0.0)
        stack.append(_Open(name, now, now, quiet))
        try:
            yield
        finally:
            end = time.perf_counter()
            entry = stack.pop()
            self._charge(entry.name, end - entry.resumed)
            if stack:
                stack[-1].resumed = end
            self._last = end
            if not entry.quiet:
                took = end - entry.entered
                own = entry.own + end - entry.resumed
                line = f"sparkgnn {name}: {took:.2f} s"
                if took - own >= QUIET_BELOW_S:  # phases ran inside it: say what is its own
                    line += f" ({own:.2f} s outside the phases inside it)"
                log.log(logging.INFO if took >= QUIET_BELOW_S else logging.DEBUG, line)

    def claim(self, name: str) -> float:
        """Charge to `name` the time since the clock started or its last phase ended, which no
        phase covered (a job script's interpreter start and imports, measured from the process's
        start); returns those seconds. Only between phases: an open phase owns that time."""
        stack = self._stack
        if stack:
            raise RuntimeError(f"claim({name!r}) inside phase {stack[-1].name!r}: that time is the phase's")
        now = time.perf_counter()
        seconds = now - self._last
        with self._lock:
            self._calls[name] = self._calls.get(name, 0) + 1
        self._charge(name, seconds)
        self._last = now
        return seconds

    def fork(self) -> PhaseClock:
        """A clock for a job run on another thread inside one of this clock's phases: activate it
        there, then `absorb` it into that phase."""
        return PhaseClock()

    def absorb(self, into: str, forks: list[PhaseClock]) -> None:
        """Keep the tables of `forks` (clocks of jobs that ran side by side inside phase `into`)
        as `into`'s detail: summary()["inside"][into], seconds and calls summed over the forks.
        Not added to the table (module doc: they overlap `into`'s wall time and each other)."""
        with self._lock:
            detail = self._inside.setdefault(into, {})
            for fork in forks:
                with fork._lock:
                    rows = [(name, value, fork._calls.get(name, 0)) for name, value in fork._seconds.items()]
                for name, value, calls in rows:
                    entry = detail.setdefault(name, [0.0, 0])
                    entry[0] += value
                    entry[1] += calls

    def seconds(self, name: str) -> float:
        """The seconds charged to `name` so far (0.0 for a phase that never ran)."""
        return self._seconds.get(name, 0.0)

    def summary(self) -> dict:
        """The table as JSON: `wall_s` (start to now), `phases` ([{name, seconds, calls}] in the
        order they first ran, open phases up to now), `accounted_s`, `unaccounted_s` (wall less
        the phases, so the rounded figures add up exactly) and `unaccounted_fraction`; with
        absorbed forks, `inside` ({phase: [{name, seconds, calls}]}, the forks' phases summed over
        them: thread seconds, not part of the wall time's split)."""
        now = time.perf_counter()
        with self._lock:
            seconds = dict(self._seconds)
            calls = dict(self._calls)
            inside = {k: dict(v) for k, v in self._inside.items()}
        for entry in self._main[-1:]:  # only the innermost open phase is charging now
            seconds[entry.name] = seconds.get(entry.name, 0.0) + now - entry.resumed
        wall = round(now - self._origin, 3)
        rounded = {name: round(value, 3) for name, value in seconds.items()}
        rows = [{"name": name, "seconds": value, "calls": calls[name]} for name, value in rounded.items()]
        accounted = round(sum(rounded.values()), 3)
        unaccounted = round(max(wall - accounted, 0.0), 3)
        doc: dict = {
            "wall_s": wall,
            "phases": rows,
            "accounted_s": accounted,
            "unaccounted_s": unaccounted,
            "unaccounted_fraction": round(unaccounted / wall, 4) if wall > 0 else 0.0,
        }
        if inside:
            doc["inside"] = {
                into: [{"name": n, "seconds": round(v[0], 3), "calls": v[1]} for n, v in detail.items()]
                for into, detail in inside.items()
            }
        return doc

    def lines(self, title: str = "job") -> list[str]:
        """The table as progress lines: one per phase (seconds, share of the wall time), then the
        unaccounted time on its own line."""
        doc = self.summary()
        wall = doc["wall_s"] or 1.0
        width = max([len(row["name"]) for row in doc["phases"]] + [len(UNACCOUNTED)])
        out = [f"sparkgnn {title} time: {doc['wall_s']:.2f} s"]
        for row in doc["phases"]:
            calls = f" ({row['calls']}x)" if row["calls"] > 1 else ""
            share = 100 * row["seconds"] / wall
            out.append(f"  {row['name']:<{width}}  {row['seconds']:8.2f} s  {share:5.1f}%{calls}")
        out.append(
            f"  {UNACCOUNTED:<{width}}  {doc['unaccounted_s']:8.2f} s  {100 * doc['unaccounted_fraction']:5.1f}%"
        )
        return out

    def log_table(self, title: str = "job") -> None:
        """Log `lines(title)` at INFO: the table a job prints when it ends."""
        for line in self.lines(title):
            log.info(line)


def active() -> PhaseClock | None:
    """The clock active in this context, or None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def activate(clock: PhaseClock) -> Iterator[PhaseClock]:
    """Make `clock` the one `phase` charges inside the block."""
    token = _ACTIVE.set(clock)
    try:
        yield clock
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def job_clock() -> Iterator[PhaseClock]:
    """The caller's active clock, or a new one started now and active for the block: what a job
    entry point (`infer`, `precompute`, `refresh`) runs under."""
    clock = _ACTIVE.get()
    if clock is not None:
        yield clock
        return
    with activate(PhaseClock()) as started:
        yield started


def phase(name: str, *, quiet: bool = False) -> contextlib.AbstractContextManager[None]:
    """`PhaseClock.phase` on the active clock; nothing without one."""
    clock = _ACTIVE.get()
    return clock.phase(name, quiet=quiet) if clock is not None else contextlib.nullcontext()


def process_start_time() -> float:
    """When this process started (epoch seconds, the kernel's record), so a job's clock covers
    the interpreter's start and the imports; now when the platform cannot say."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil missing or the platform without the record: start now
        return time.time()
