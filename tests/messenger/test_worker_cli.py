"""`sparkgnn-worker` argument handling and wiring (the torch handler is replaced by a stub; the
real one is the lead's sparkgnn.dl.handler)."""

import pathlib
import sys
import types

import fixture_handlers as fh
import pytest

from sparkgnn.worker import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_console_scripts_point_at_the_right_mains():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'sparkgnn-worker = "sparkgnn.worker.cli:main"' in text
    assert 'sparkgnn-broker = "sparkgnn.messenger.broker:main"' in text


def test_parse_args(tmp_path):
    args = cli.parse_args(
        ["--connect", "ipc:///tmp/x.ipc", "--device", "cuda:1", "--model-store", str(tmp_path), "--threads", "2"]
    )
    assert (args.connect, args.device, args.model_store, args.threads) == (
        "ipc:///tmp/x.ipc",
        "cuda:1",
        str(tmp_path),
        2,
    )
    for bad in (["--device", "tpu"], ["--model-store", str(tmp_path / "missing")]):
        argv = ["--model-store", str(tmp_path)] + bad
        with pytest.raises(SystemExit):
            cli.parse_args(argv)


def test_main_builds_the_dl_handler_and_serves_it(tmp_path, monkeypatch, thread_cluster):
    calls = {}

    def build_handler(model_store, device, threads, ops):
        calls.update(model_store=model_store, device=device, threads=threads)
        calls["worker_ops"] = {"serve_batch", "serve_evict"} <= set(ops)  # on this worker's deployment cache
        return fh.scale

    monkeypatch.setitem(sys.modules, "sparkgnn.dl.handler", types.SimpleNamespace(build_handler=build_handler))
    cluster = thread_cluster(scheme="ipc", workers=0)
    served = {}

    def fake_run_from_args(args, handler, info=None):
        served.update(connect=args.connect, handler=handler, info=info)
        return 0

    monkeypatch.setattr(cli.messenger_worker, "run_from_args", fake_run_from_args)
    assert cli.main(["--connect", cluster.back, "--model-store", str(tmp_path), "--threads", "1"]) == 0
    assert calls == {"model_store": str(tmp_path), "device": "cpu", "threads": 1, "worker_ops": True}
    assert served == {"connect": cluster.back, "handler": fh.scale, "info": {"device": "cpu"}}
