"""Workers serve only what they were started with (serving.served): the serving ops, called
through the handler a `sparkgnn-worker` builds, refuse a header that names paths or options and
an id the worker was not started with; the deployments file is re-read when its controller
changes it and refused when others could write it; serve_evict drops only withdrawn ids."""

from __future__ import annotations

import os

import pytest

from sparkgnn.serving import served
from sparkgnn.serving.online import batch_op

SPEC = {"graph": "/srv/g", "model": "/srv/model.pt", "store": "/srv/store", "options": {}, "cache": {}}


@pytest.fixture
def worker_handler(tmp_path):
    """The handler `sparkgnn-worker --deployments FILE` serves (the file lists SPEC), and the file."""
    from sparkgnn.worker.cli import build, parse_args

    (tmp_path / "models").mkdir()
    path = str(tmp_path / "deployments.json")
    served.write_file(path, [SPEC])
    args = parse_args(["--connect", "tcp://127.0.0.1:5556", "--model-store", str(tmp_path / "models")])
    args.deployments = path
    try:
        yield build(args), path
    finally:
        served.serve_file(None)


@pytest.mark.parametrize(
    "header, message",
    [
        ({"op": "serve_batch", "deployment": SPEC, "mode": "he", "requests": []}, "must be a deployment id"),
        ({"op": "serve_batch", "deployment": "/etc/passwd", "mode": "he", "requests": []}, "must be a deployment id"),
        (
            {"op": "serve_batch", "deployment": served.deployment_id(SPEC), "cache": {"bytes": 1 << 40}},
            "not accepted",
        ),
        ({"op": "serving_partials", "partition": 0, "cfg": {"graph_dir": "/etc"}, "job": {}}, "not accepted"),
        ({"op": "serving_partials", "partition": 0, "model": "/srv/m.pt", "job": {}}, "must be a deployment id"),
        ({"op": "serve_evict", "retire": ['{"graph": "/srv/g"}']}, "must be a deployment id"),
    ],
)
def test_a_header_naming_a_path_or_option_is_refused_by_the_worker(worker_handler, header, message):
    handler, _ = worker_handler
    with pytest.raises(served.UnknownDeployment, match=message) as caught:
        handler(header, {})
    assert "\n" not in str(caught.value) and "/srv" not in str(caught.value)


def test_an_unknown_deployment_id_is_refused_in_one_line(worker_handler):
    handler, _ = worker_handler
    unknown = "ab" * 32
    for header in (
        {"op": "serve_batch", "deployment": unknown, "mode": "he", "requests": []},
        {"op": "serving_partials", "deployment": unknown, "partition": 0, "parts": 2, "states": True, "job": {}},
    ):
        with pytest.raises(served.UnknownDeployment, match="is not served here") as caught:
            handler(header, {})
        assert "\n" not in str(caught.value) and "/srv" not in str(caught.value)
    assert served.lookup(served.deployment_id(SPEC)) == SPEC  # the started-with one is served


def test_partition_settings_are_checked_before_anything_is_loaded(worker_handler):
    handler, _ = worker_handler
    key = served.deployment_id(SPEC)
    base = {"op": "serving_partials", "deployment": key, "states": True, "job": {}}
    with pytest.raises(ValueError, match="'parts' must be an integer in 1..65536"):
        handler(dict(base, partition=0, parts=1 << 20), {})
    with pytest.raises(ValueError, match="'partition' must be an integer in 0..2"):
        handler(dict(base, partition=3, parts=3), {})


def test_the_deployments_file_is_reread_when_its_controller_changes_it(tmp_path):
    path = str(tmp_path / "deployments.json")
    other = dict(SPEC, graph="/srv/g2")
    served.write_file(path, [SPEC])
    try:
        assert served.serve_file(path) == 1
        with pytest.raises(served.UnknownDeployment, match="is not served here"):
            served.lookup(served.deployment_id(other))
        served.write_file(path, [SPEC, other])  # the controller adds a version
        assert served.lookup(served.deployment_id(other)) == other
        served.write_file(path, [other])  # ... and withdraws the first
        assert not served.serves(served.deployment_id(SPEC)) and served.serves(served.deployment_id(other))
        os.chmod(path, 0o620)
        served.write_file(path, [SPEC])
        os.chmod(path, 0o622)  # writable by others: refused, not read
        with pytest.raises(served.UnknownDeployment, match="writable by no one else"):
            served.lookup(served.deployment_id(SPEC))
    finally:
        served.serve_file(None)


def test_the_worker_cli_refuses_a_missing_deployments_file(tmp_path, capsys):
    from sparkgnn.worker.cli import parse_args

    (tmp_path / "models").mkdir()
    with pytest.raises(SystemExit) as caught:
        parse_args(["--model-store", str(tmp_path / "models"), "--deployments", str(tmp_path / "nope.json")])
    assert caught.value.code == 2 and "--deployments" in capsys.readouterr().err


def test_serve_evict_drops_only_what_the_controller_withdrew():
    from sparkgnn.serving.online.wire import read_meta

    key = served.register(SPEC)
    cache = batch_op.DeploymentCache()
    cache.put(key, object(), 0)  # type: ignore[arg-type]  # stands for a loaded one
    try:
        meta = batch_op.serve_evict({"op": "serve_evict", "retire": [key]}, {}, cache)
        assert read_meta(meta)["kept"] == [key] and key in cache.keys()
        served.withdraw(key)
        assert read_meta(batch_op.serve_evict({"retire": [key]}, {}, cache))["evicted"] == [key]
        assert key not in cache.keys()
    finally:
        served.withdraw(key)
