"""engine.calibration: a work dir's measured layers refit the cost model of the next plan."""

import json
import logging
import os
from types import SimpleNamespace

from sparkgnn.engine import calibration
from sparkgnn.planner import CostModel


def _plan(*layer_estimates):
    return SimpleNamespace(layers=[SimpleNamespace(estimates=e) for e in layer_estimates])


EST = {"shuffle_bytes": 9e8, "python_bytes": 1.3e9, "passes": 1, "edges": 8e6, "seconds": 12.6}


def test_recorded_layers_refit_the_model_for_the_same_core_count_only(tmp_path):
    work = str(tmp_path)
    assert calibration.load(work, 2) == (CostModel(), 0)
    assert calibration.record(work, 2, _plan(EST, EST), {0: 30.0, 1: 29.0, -1: 5.0}) == 2
    model, count = calibration.load(work, 2)
    assert count == 2
    predicted = model.seconds(EST["shuffle_bytes"], EST["python_bytes"], EST["passes"], EST["edges"])
    default = CostModel().seconds(EST["shuffle_bytes"], EST["python_bytes"], EST["passes"], EST["edges"])
    assert abs(predicted - 29.5) < abs(default - 29.5)
    assert calibration.load(work, 64) == (CostModel(), 0)  # another cluster shape learns nothing from it
    assert "refit from 2 measured layers" in calibration.summary(model, count, work)


def test_layers_without_a_measurement_are_not_recorded_and_the_store_is_capped(tmp_path):
    work = str(tmp_path)
    assert calibration.record(work, 2, _plan(EST, EST), {0: 0.0}) == 0
    assert not os.path.exists(os.path.join(work, calibration.CALIBRATION_FILE))
    for _ in range(calibration.MAX_OBSERVATIONS):
        calibration.record(work, 2, _plan(EST), {0: 10.0})
    assert calibration.record(work, 2, _plan(EST), {0: 11.0}) == calibration.MAX_OBSERVATIONS
    with open(os.path.join(work, calibration.CALIBRATION_FILE)) as fh:
        kept = json.load(fh)["by_cores"]["2"]
    assert kept[-1]["seconds"] == 11.0 and len(kept) == calibration.MAX_OBSERVATIONS


def test_an_unreadable_file_is_reported_and_left_alone(tmp_path, caplog):
    work = str(tmp_path)
    path = os.path.join(work, calibration.CALIBRATION_FILE)
    with open(path, "w") as fh:
        fh.write("{not json")
    caplog.set_level(logging.INFO, logger="sparkgnn")
    assert calibration.load(work, 2) == (CostModel(), 0)
    assert calibration.record(work, 2, _plan(EST), {0: 10.0}) == 0
    assert all("calibration.json is unreadable" in line for line in caplog.messages) and len(caplog.messages) == 2
    with open(path) as fh:
        assert fh.read() == "{not json"


def test_jobs_recording_side_by_side_keep_every_observation(tmp_path, monkeypatch):
    # a typed round's relation jobs finish on several driver threads: each read-extend-replace of
    # the file runs in turn (a slow read widens the window in which one could drop another's)
    import threading
    import time

    work, slow_read = str(tmp_path), calibration._read

    def read(path):
        time.sleep(0.01)
        return slow_read(path)

    monkeypatch.setattr(calibration, "_read", read)
    threads = [threading.Thread(target=calibration.record, args=(work, 2, _plan(EST), {0: 10.0 + i})) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with open(os.path.join(work, calibration.CALIBRATION_FILE)) as fh:
        assert len(json.load(fh)["by_cores"]["2"]) == 6
