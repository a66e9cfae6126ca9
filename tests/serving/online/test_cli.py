"""sparkgnn-serve's command line: refusals are one line naming the flag; `tune` replays recorded
requests against real services and writes the chosen T_d / T_s into the deployment's config."""

from __future__ import annotations

import json
import logging
import stat

import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving.online.cli import build_parser, config_from, main
from sparkgnn.serving.online.config import ServeConfig
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.request import write_requests


def test_missing_inputs_are_one_line_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--graph", str(tmp_path / "nope"), "--model", str(tmp_path / "m.pt")])
    assert info.value.code == 2
    assert "--graph" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"graph": "g", ', "not JSON"),
        ("[1, 2]", "a deployment is one JSON object of settings, not a list"),
        ('{"graph": "g", "model": "m", "capacity": "big"}', "capacity: expected int, got str"),
        ('{"graph": "g", "model": "m", "pools": [{"name": "p", "width": 0}]}', "width must be >= 1, got 0"),
        ('{"graph": "g", "model": "m", "pools": [{"name": "p", "widht": 2}]}', "unknown settings ['widht']"),
        ('{"graph": "g", "model": "m", "capcity": 5}', "unknown deployment settings ['capcity']"),
        ('{"graph": "g", "model": "m", "request_timeout_s": 0}', "request_timeout_s must be a finite number > 0"),
        ('{"graph": "g", "model": "m", "modes": "he"}', "modes: expected array, got str"),
        ('{"graph": "g", "model": "m", "http": "abc"}', "HTTP bind 'abc' must be HOST:PORT"),
    ],
)
def test_config_errors_are_one_line_with_exit_2(tmp_path, capsys, content, why):
    config = tmp_path / "deploy.json"
    config.write_text(content)
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparkgnn-serve: error:") and why in err and "\n" not in err


@pytest.mark.parametrize(
    "flags, why",
    [
        (["--http", "abc"], "HTTP bind 'abc' must be HOST:PORT"),
        (["--http", "abc", "--token", "T"], "HTTP bind 'abc' must be HOST:PORT"),
        (["--http", "127.0.0.1:99999"], "port in 0..65535"),
        (["--http", "10.1.2.3:8080"], "is not loopback: give a token"),
        (["--bind", "tcp://10.1.2.3:5555"], "binding non-loopback tcp://10.1.2.3:5555 requires CURVE keys"),
    ],
)
def test_bind_addresses_are_checked_with_one_line(tmp_path, capsys, flags, why):
    (tmp_path / "g").mkdir()
    (tmp_path / "m.pt").write_text("")
    assert main(["serve", "--graph", str(tmp_path / "g"), "--model", str(tmp_path / "m.pt"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparkgnn-serve: error:") and why in err and "\n" not in err


def test_a_missing_graph_exits_2(tmp_path, capsys):
    (tmp_path / "m.pt").write_text("")
    assert main(["serve", "--model", str(tmp_path / "m.pt")]) == 2
    assert "give --config, or --graph and --model" in capsys.readouterr().err


def test_tune_writes_thresholds_into_the_config(skewed_workload, tmp_path):
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(tmp_path / "model.pt"))
    write_graph_dir(G, str(tmp_path / "g"))
    precompute_local(G, model, str(tmp_path / "store"))
    write_requests(str(tmp_path / "requests" / "r.parquet"), wl.requests)
    config = tmp_path / "deploy.json"
    ServeConfig(
        graph=str(tmp_path / "g"), model=str(tmp_path / "model.pt"), store=str(tmp_path / "store"), http=None
    ).save(str(config))
    config.chmod(0o600)  # it may hold tokens
    code = main(
        [
            "tune",
            "--config",
            str(config),
            "--requests",
            str(tmp_path / "requests"),
            "--rate",
            "40",
            "--seconds",
            "0.3",
            "--td",
            "64,100000",
        ]
    )
    assert code == 0
    saved = json.loads(config.read_text())
    tuning = json.loads((tmp_path / "deploy.json.tuning.json").read_text())
    assert saved["t_d"] in (64.0, 100000.0)
    assert saved["t_d"] == tuning["t_d"] and saved["t_s"] == tuning["t_s"]
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # the rewrite kept the file's mode
    assert {p["t_d"] for p in tuning["points"]} == {64.0, 100000.0}


def test_tokens_come_from_files_or_the_environment_and_argv_only_on_loopback(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("SPARKGNN_SERVE_TOKEN", raising=False)
    monkeypatch.delenv("SPARKGNN_SERVE_ADMIN_TOKEN", raising=False)
    base = ["serve", "--graph", "g", "--model", "m"]
    token_file, admin_file = tmp_path / "token", tmp_path / "admin"
    token_file.write_text("from-file\n")
    admin_file.write_text("admin-from-file\n")

    def config(*flags):
        return config_from(build_parser().parse_args([*base, *flags]))

    got = config("--token-file", str(token_file), "--admin-token-file", str(admin_file))
    assert (got.token, got.admin_token) == ("from-file", "admin-from-file")
    monkeypatch.setenv("SPARKGNN_SERVE_TOKEN", "from-env")
    monkeypatch.setenv("SPARKGNN_SERVE_ADMIN_TOKEN", "admin-from-env")
    got = config()
    assert (got.token, got.admin_token) == ("from-env", "admin-from-env")
    monkeypatch.delenv("SPARKGNN_SERVE_TOKEN")
    with caplog.at_level(logging.WARNING):
        assert config("--token", "on-argv").token == "on-argv"  # loopback: taken, with a warning
    assert any("visible to every local user" in r.getMessage() for r in caplog.records)
    with pytest.raises(ServeError, match="loopback service only"):
        config("--token", "on-argv", "--http", "0.0.0.0:8080")
    with pytest.raises(ServeError, match="holds no token"):
        (tmp_path / "blank").write_text("\n")
        config("--token-file", str(tmp_path / "blank"))
    with pytest.raises(ServeError, match="must differ"):
        config("--token-file", str(admin_file), "--admin-token-file", str(admin_file))


def test_follow_store_flags_set_the_deployment_and_need_a_store():
    def config(*flags):
        return config_from(build_parser().parse_args(["serve", "--graph", "g", "--model", "m", *flags]))

    assert not config("--store", "s").follow_store
    got = config("--store", "s", "--follow-store", "--follow-interval-s", "0.2")
    assert got.follow_store and got.follow_interval_s == 0.2
    with pytest.raises(ServeError, match="follow_store needs a PE store"):
        config("--follow-store")


def test_fronts_flag_sets_the_deployment_and_needs_the_http_front():
    def config(*flags):
        return config_from(build_parser().parse_args(["serve", "--graph", "g", "--model", "m", *flags]))

    assert config().fronts == 1 and config("--fronts", "2").fronts == 2
    with pytest.raises(ServeError, match="fronts=2 needs the HTTP front"):
        config("--fronts", "2", "--http", "")
