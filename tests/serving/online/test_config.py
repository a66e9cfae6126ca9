"""ServeConfig: the new bounds are checked as one line each; `save` keeps a config's permission
bits (a 0600 file that may hold tokens stays 0600) and makes a new one 0600; swap paths resolve
under the swap roots (links and `..` followed), with one answer for outside and missing."""

from __future__ import annotations

import os
import stat

import pytest

from sparkgnn.serving.online.config import ServeConfig, swap_path
from sparkgnn.serving.online.pools import ServeError


def test_save_keeps_the_files_mode_and_a_new_config_is_private(tmp_path):
    path = tmp_path / "deploy.json"
    ServeConfig(graph="g", model="m").save(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o640)
    ServeConfig(graph="g", model="m", t_d=7.0).save(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert ServeConfig.load(str(path)).t_d == 7.0
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


@pytest.mark.parametrize(
    "overrides, why",
    [
        ({"max_cost": 0.0}, "max_cost must be a finite number > 0"),
        ({"queue_bytes": 0}, "queue_bytes must be an integer >= 1"),
        ({"parse_threads": 0}, "parse_threads must be an integer >= 1"),
        ({"batch_timeout_s": float("inf")}, "batch_timeout_s must be a finite number > 0"),
        ({"tls_cert": "c.pem"}, "needs both tls_cert and tls_key"),
        ({"token": "t", "admin_token": "t"}, "admin_token must differ from token"),
        ({"swap_roots": "/data"}, "swap_roots must be a list"),
        ({"pools": [{"name": "w", "kind": "workers", "transport": "udp"}]}, "transport must be one of ipc, tcp"),
        ({"pools": [{"name": "p", "kind": "inprocess", "transport": "tcp"}]}, "transport applies to a 'workers' pool"),
    ],
)
def test_out_of_range_bounds_are_one_line(overrides, why):
    with pytest.raises(ServeError, match=why):
        ServeConfig(graph="g", model="m", **overrides).check()


def test_swap_paths_resolve_under_the_roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "g2").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    roots = [str(root)]
    assert swap_path(str(root / "g2"), roots, ["file"]) == os.path.realpath(root / "g2")
    assert swap_path(f"file://{root / 'g2'}", roots, ["file"]) == os.path.realpath(root / "g2")
    for refused in (str(outside), str(root / "missing"), str(root / "escape"), str(root / ".." / "outside")):
        assert swap_path(refused, roots, ["file"]) is None, refused
    assert swap_path(str(root / "g2"), roots, ["s3"]) is None  # local paths need "file" allowed
    assert swap_path("s3://b/data/g2", ["s3://b/data"], ["file", "s3"]) == "s3://b/data/g2"
    assert swap_path("s3://b/data/../etc", ["s3://b/data"], ["s3"]) is None
    assert swap_path("hdfs://b/data/g2", ["hdfs://b/data"], ["file"]) is None  # scheme not allowed
