"""sparkgnn.serving.online.tuner: the two 1-D searches find the minimum of a bowl-shaped latency and
record every measurement; candidate_ts hits the requested divided fractions; the thresholds config
round-trips and refuses what is not one."""

import json

import pytest

from sparkgnn.serving.online.tuner import (
    TunerError,
    TuneResult,
    candidate_ts,
    read_thresholds,
    tune,
    write_thresholds,
)


def bowl(t_d, t_s):
    # Minimum at T_d = 300; the best T_s depends on T_d (= 2 T_d), as batches grow with T_d.
    return (t_d - 300) ** 2 / 1e4 + (t_s - 2 * t_d) ** 2 / 1e5 + 1.0


def test_tune_finds_the_bowls_minimum_with_two_one_dimensional_searches():
    calls = []

    def measure(t_d, t_s):
        calls.append((t_d, t_s))
        return bowl(t_d, t_s)

    tds = [100, 200, 300, 400]
    result = tune(measure, tds, lambda t_d: [int(t_d), int(2 * t_d), int(3 * t_d)])
    assert (result.t_d, result.t_s, result.latency) == (300.0, 600, 1.0)
    # T_s search: 3 per T_d; pair search: one per T_d; all recorded, in order
    assert len(calls) == 4 * 3 + 4
    assert [(p["t_d"], p["t_s"]) for p in result.points] == calls
    assert [p["stage"] for p in result.points] == ["ts"] * 12 + ["pair"] * 4
    assert [(p["t_d"], p["t_s"]) for p in result.pairs] == [(t, 2 * t) for t in tds]
    assert all(p["latency"] == bowl(p["t_d"], p["t_s"]) for p in result.points)


def test_tune_without_remeasure_and_with_divided_fraction_recorded():
    result = tune(bowl, [200, 300], [400, 600], divided_fraction=lambda t_d, t_s: t_d / t_s, remeasure=False)
    assert (result.t_d, result.t_s) == (300.0, 600)
    assert len(result.points) == 4 and {p["stage"] for p in result.points} == {"ts"}
    assert result.points[0]["divided"] == pytest.approx(0.5)


def test_tune_refuses_empty_spaces_and_nan():
    with pytest.raises(TunerError, match="T_d"):
        tune(bowl, [], [1])
    with pytest.raises(TunerError, match="T_s"):
        tune(bowl, [1], [])
    with pytest.raises(TunerError, match="NaN"):
        tune(lambda t_d, t_s: float("nan"), [1], [1])


def test_candidate_ts_divides_the_requested_fractions_of_batches():
    # 100 sample batches of 2 layers; the largest layer of batch i is 10 * (i + 1)
    batches = [(i, 10 * (i + 1)) for i in range(100)]
    found = candidate_ts(batches, fractions=(0.10, 0.25))
    assert found == [750, 900]
    largest = [max(b) for b in batches]
    for t_s, f in zip(found, (0.25, 0.10), strict=True):
        assert sum(m > t_s for m in largest) / len(largest) == pytest.approx(f)
    # ties: never more than the fraction is divided
    assert candidate_ts([(5,)] * 10, fractions=(0.2,)) == [5]
    with pytest.raises(TunerError):
        candidate_ts([], fractions=(0.1,))
    with pytest.raises(TunerError):
        candidate_ts(batches, fractions=(1.5,))


def test_thresholds_round_trip(tmp_path):
    result = tune(bowl, [200, 300], [400, 600])
    path = str(tmp_path / "conf" / "thresholds.json")
    write_thresholds(path, result, {"model": "sage", "rate": 250})
    back, extra = read_thresholds(path)
    assert isinstance(back, TuneResult) and back == result
    assert extra == {"model": "sage", "rate": 250}
    assert [p.name for p in (tmp_path / "conf").iterdir()] == ["thresholds.json"]  # no temporary left


def test_read_thresholds_refuses_missing_and_foreign_files(tmp_path):
    with pytest.raises(TunerError, match="run the tuner first"):
        read_thresholds(str(tmp_path / "none.json"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"t_d": 1}))
    with pytest.raises(TunerError, match="not a thresholds config"):
        read_thresholds(str(other))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(TunerError, match="not JSON"):
        read_thresholds(str(broken))
