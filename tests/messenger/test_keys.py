"""`sparkgnn-keys`: key pairs with private secret files, allow-lists filled from public files,
nothing ever replaced, user mistakes as one line with exit code 2."""

import os
import stat

from sparkgnn.messenger import security
from sparkgnn.messenger.keys import main


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_pairs_are_private_and_allow_lists_take_public_files_only(tmp_path, capsys):
    server, host = tmp_path / "server", tmp_path / "host"
    assert main(["new", "server", str(server)]) == 0
    assert main(["new", "worker", str(host)]) == 0
    assert mode(server / "server.key_secret") == 0o600 and mode(server) == 0o700
    assert (server / "authorized_clients").is_dir() and (server / "authorized_workers").is_dir()
    pair = security.load_keypair(host, "worker")
    assert pair.public.decode() in capsys.readouterr().out
    assert main(["allow", "worker", str(server), str(host / "worker.key"), "--name", "gpu1"]) == 0
    assert security.allowed_keys(server, "worker") == {pair.public}
    assert security.allowed_keys(server, "client") == frozenset()

    assert main(["new", "server", str(server)]) == 2  # never replaced
    err = capsys.readouterr().err.strip()
    assert err.startswith("sparkgnn-keys: error: ") and "exists" in err and "\n" not in err
    assert main(["allow", "worker", str(server), str(host / "worker.key_secret")]) == 2
    assert "holds a secret key" in capsys.readouterr().err


def test_all_makes_a_set_a_broker_worker_and_dealer_can_use(tmp_path):
    keys = tmp_path / "k"
    assert main(["all", str(keys)]) == 0
    security.check_server_dir(keys, ("client", "worker"))
    for role in ("client", "worker"):
        assert security.load_keypair(keys, role).public in security.allowed_keys(keys, role)
    assert security.ClientKeys.from_dir(keys).server == security.server_public_key(keys)
