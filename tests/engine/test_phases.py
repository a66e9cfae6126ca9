"""engine.phases: every second of a job charged to one phase or to "unaccounted"."""

import logging
import time

import pytest

from sparkgnn.engine import phases
from sparkgnn.engine.phases import UNACCOUNTED, PhaseClock


def _by_name(doc: dict) -> dict:
    return {row["name"]: row for row in doc["phases"]}


def test_phases_and_the_unaccounted_rest_add_up_to_the_wall_time():
    clock = PhaseClock()
    started = time.perf_counter()
    with clock.phase("outer"):
        time.sleep(0.03)
        with clock.phase("inner"):
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    first = _by_name(clock.summary())
    # nested time counts for the inner phase only: the two share the block's time
    assert first["outer"]["seconds"] >= 0.03 and first["inner"]["seconds"] >= 0.05
    assert first["outer"]["seconds"] + first["inner"]["seconds"] == pytest.approx(elapsed, abs=0.005)
    time.sleep(0.04)  # in no phase
    with clock.phase("inner"):
        time.sleep(0.01)
    doc = clock.summary()
    rows = _by_name(doc)
    assert list(rows) == ["outer", "inner"] and rows["inner"]["calls"] == 2
    assert rows["inner"]["seconds"] >= first["inner"]["seconds"] + 0.01 - 0.002  # each rounded to 1 ms
    assert doc["unaccounted_s"] >= 0.04
    total = sum(row["seconds"] for row in doc["phases"])
    assert total == pytest.approx(doc["accounted_s"], abs=1e-9)
    assert doc["accounted_s"] + doc["unaccounted_s"] == pytest.approx(doc["wall_s"], abs=1e-9)
    assert doc["unaccounted_fraction"] == pytest.approx(doc["unaccounted_s"] / doc["wall_s"], abs=1e-4)


def test_a_clock_started_in_the_past_claims_the_time_before_its_first_phase():
    clock = PhaseClock(started_at=time.time() - 2.0)  # e.g. the process's start
    claimed = clock.claim("python start and imports")
    assert 2.0 <= claimed < 3.0
    doc = clock.summary()
    assert doc["wall_s"] >= 2.0 and doc["unaccounted_s"] < 0.5
    with clock.phase("work"), pytest.raises(RuntimeError, match="inside phase 'work'"):
        clock.claim("more")


def test_the_table_ends_with_the_unaccounted_line_and_phases_log_as_they_end(caplog):
    clock = PhaseClock()
    with caplog.at_level(logging.DEBUG, logger="sparkgnn.engine.phases"), clock.phase("graph open"):
        with clock.phase("step", quiet=True):
            time.sleep(0.06)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("sparkgnn graph open: ")  # the quiet step logs nothing
    assert "outside the phases inside it" in messages[0]
    lines = clock.lines("job")
    assert lines[0].startswith("sparkgnn job time: ")
    assert [line.split()[0] for line in lines[1:]] == ["graph", "step", UNACCOUNTED]


def test_library_phases_charge_the_active_clock_or_nothing():
    with phases.phase("no clock"):  # no clock active: a no-op
        pass
    assert phases.active() is None
    outer = PhaseClock()
    with phases.activate(outer):
        with phases.job_clock() as clock:  # a job inside a caller's clock shares it
            assert clock is outer
            with phases.phase("prepare"):
                pass
    assert "prepare" in _by_name(outer.summary())
    with phases.job_clock() as own:  # none active: one for the call
        assert phases.active() is own
    assert phases.active() is None


@pytest.mark.parametrize("name", ["", UNACCOUNTED])
def test_a_phase_needs_a_name_of_its_own(name):
    with pytest.raises(ValueError, match="needs a name"), PhaseClock().phase(name):
        pass


def test_process_start_time_is_in_the_past():
    assert phases.process_start_time() <= time.time()


def test_threads_keep_their_own_open_phases_on_one_clock():
    # thread b opens its phase while a's is open and closes it after a's: with one shared stack
    # a's exit would close b's phase and b's would close a's, so b would be charged half its time
    import threading

    clock = PhaseClock()
    a_open, b_open = threading.Event(), threading.Event()

    def a() -> None:
        with clock.phase("a", quiet=True):
            a_open.set()
            b_open.wait(5)
            time.sleep(0.1)

    def b() -> None:
        a_open.wait(5)
        with clock.phase("b", quiet=True):
            b_open.set()
            time.sleep(0.2)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = _by_name(clock.summary())
    assert 0.09 <= rows["a"]["seconds"] < 0.18
    assert rows["b"]["seconds"] >= 0.19


def test_forks_are_kept_as_the_detail_of_the_phase_they_ran_in():
    clock = PhaseClock()
    with clock.phase("round", quiet=True):
        forks = [clock.fork() for _ in range(2)]
        for fork in forks:
            with phases.activate(fork), phases.phase("plan", quiet=True):
                time.sleep(0.02)
        clock.absorb("round", forks)
    doc = clock.summary()
    # the forks' seconds are the round's detail, not rows of the table: it still adds up
    assert set(_by_name(doc)) == {"round"}
    assert abs(doc["accounted_s"] + doc["unaccounted_s"] - doc["wall_s"]) < 1e-6
    (plan,) = doc["inside"]["round"]
    assert plan["name"] == "plan" and plan["calls"] == 2 and plan["seconds"] >= 0.04
