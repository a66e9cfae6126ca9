"""The executor tests' rerun rule (engine_helpers.exact_or_transient): a miss that repeats fails,
a miss the rerun does not repeat passes with a transient-deviation warning naming it, a plain
UserWarning (which pytest-xdist's controller can re-create)."""

import pytest
from engine_helpers import TRANSIENT_DEVIATION, exact_or_transient


def _attempts(misses: set[int]):
    runs: list[int] = []

    def attempt(rerun: int) -> None:
        runs.append(rerun)
        assert rerun not in misses, f"off by 2e-05 on run {rerun}"

    return attempt, runs


def test_a_check_that_passes_runs_once():
    attempt, runs = _attempts(set())
    exact_or_transient(attempt, "job")
    assert runs == [0]


def test_a_miss_the_rerun_does_not_repeat_is_reported():
    attempt, runs = _attempts({0})
    with pytest.warns(
        UserWarning, match=r"job: the first run missed and the rerun agreed: off by 2e-05 on run 0"
    ) as got:
        exact_or_transient(attempt, "job")
    assert [type(w.message) for w in got] == [UserWarning]  # builtins: importable by xdist's controller
    assert str(got[0].message).startswith(f"{TRANSIENT_DEVIATION}: job: ")
    assert runs == [0, 1]


def test_a_miss_that_repeats_fails():
    attempt, runs = _attempts({0, 1})
    with pytest.raises(AssertionError, match="off by 2e-05 on run 1"):
        exact_or_transient(attempt, "job")
    assert runs == [0, 1]
