"""`sparkgnn-keys`: the persistent CURVE keys of a messenger deployment (security.py says what
each file is for).

    sparkgnn-keys new server DIR        server.key + server.key_secret, empty allow-lists
    sparkgnn-keys new client DIR        client.key + client.key_secret (a dealer's / service client's)
    sparkgnn-keys new worker DIR        worker.key + worker.key_secret (a worker's, shown to the broker)
    sparkgnn-keys allow client DIR FILE list a client's public key (FILE) in DIR/authorized_clients/
    sparkgnn-keys allow worker DIR FILE list a worker's public key in DIR/authorized_workers/
    sparkgnn-keys all DIR               all three pairs in DIR, the client and worker keys listed

Secret files are created 0600 and existing key files are never replaced. User errors (a file that
exists, a file without a key) are one line on stderr with exit code 2 (cli.py).
"""

from __future__ import annotations

import argparse
import logging
import sys

from sparkgnn.messenger import cli, security

PROG = "sparkgnn-keys"
log = logging.getLogger("sparkgnn.messenger.keys")  # not __name__: also run as __main__ (-m)


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new", help="make a key pair")
    new.add_argument("role", choices=security.ROLES)
    new.add_argument("dir", help="keys folder (made 0700 when missing)")
    allow = sub.add_parser("allow", help="list a public key on a server's allow-list")
    allow.add_argument("role", choices=tuple(security.ALLOW_DIRS))
    allow.add_argument("dir", help="the server's keys folder")
    allow.add_argument("public_key", help="the peer's public key file (client.key or worker.key)")
    allow.add_argument("--name", default=None, help="file name in the allow-list (default: the key file's)")
    every = sub.add_parser("all", help="server, client and worker key pairs in one folder, listed")
    every.add_argument("dir", help="keys folder (made 0700 when missing)")
    return p.parse_args(argv)


def _run(args: argparse.Namespace) -> int:
    cli.install_cli_handler(prefix=f"[{PROG}] ")
    if args.command == "new":
        pair = security.make_keypair(args.dir, args.role)
        log.info(f"{security.secret_path(args.dir, args.role)} (secret, 0600) and {args.role}.key")
        log.info(f"public key: {pair.public.decode()}")
    elif args.command == "allow":
        listed = security.allow(args.dir, args.role, args.public_key, args.name)
        log.info(f"listed {args.public_key} as {listed}")
    else:
        security.make_full_set(args.dir)
        log.info(f"server, client and worker keys in {args.dir}; the client and worker keys are listed")
    return 0


def main(argv=None) -> int:
    """`sparkgnn-keys`: make key pairs and fill allow-lists."""
    args = parse_args(argv)
    return cli.run(PROG, lambda: _run(args))


if __name__ == "__main__":
    sys.exit(main())
