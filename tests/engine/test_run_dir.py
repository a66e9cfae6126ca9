"""engine.run_dir: a step counts as complete only through its marker, which names the run's key;
a run keeps its directory only when told to and only when a step was committed."""

import json
import os

from sparkgnn.engine.run_dir import COMMIT_NAME, RUNS_DIR, RunDir, run_key


def test_the_key_changes_with_any_fact_and_not_with_their_order():
    facts = {"graph": "g1", "model": "m1", "partitions": 4}
    assert run_key(facts) == run_key(dict(reversed(list(facts.items()))))
    assert run_key(facts) != run_key(dict(facts, model="m2"))
    assert run_key(facts) != run_key(dict(facts, partitions=5))


def test_only_committed_steps_count(tmp_path):
    run = RunDir(str(tmp_path), "k1")
    assert run.path == f"{tmp_path}/{RUNS_DIR}/k1"
    run.make_step(0)
    run.make_step(1)
    assert run.last_committed(5) is None  # directories alone are not commits
    run.commit(0, {"attempt": "a0"})
    assert run.last_committed(5) == 0 and run.marker(0)["attempt"] == "a0"
    run.commit(1, {"attempt": "a1"})
    assert run.last_committed(5) == 1
    assert run.last_committed(1) == 0  # the final step is never resumed from: it writes the output
    assert [n for n in os.listdir(run.step_dir(1)) if n.startswith(".") or ".tmp" in n] == []


def test_a_marker_of_another_key_or_a_torn_marker_is_not_a_commit(tmp_path):
    run = RunDir(str(tmp_path), "k1")
    run.make_step(0)
    with open(os.path.join(run.step_dir(0), COMMIT_NAME), "w") as fh:
        json.dump({"key": "other", "step": 0}, fh)
    assert run.marker(0) is None
    with open(os.path.join(run.step_dir(0), COMMIT_NAME), "w") as fh:
        fh.write('{"key": "k1", "st')
    assert run.marker(0) is None


def test_making_a_step_again_withdraws_its_commit(tmp_path):
    run = RunDir(str(tmp_path), "k1")
    run.make_step(0)
    run.commit(0, {})
    run.make_step(0)  # a rerun recomputing the step: until it commits, the step is not complete
    assert run.marker(0) is None


def test_close_keeps_a_run_only_when_asked_and_when_it_holds_a_commit(tmp_path):
    run = RunDir(str(tmp_path), "k1")
    run.make_step(0)
    assert run.close(keep=True) is False and not os.path.exists(run.path)  # nothing to resume from
    run.make_step(0)
    run.commit(0, {})
    assert run.close(keep=True) is True and run.marker(0) is not None
    assert run.size_bytes() > 0
    assert run.close(keep=False) is False and not os.path.exists(run.path)
    assert os.listdir(tmp_path / RUNS_DIR) == []  # only the run's own directory went
    run.drop_step(3)  # dropping what is not there is not an error
