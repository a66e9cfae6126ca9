"""CURVE set-up from a directory made by `zmq.auth.create_certificates(DIR, "server")`.

WHY one directory: the broker and the workers' data sockets are the servers of this system; they
share the server key pair in DIR (server.key + server.key_secret), so a dealer needs exactly one
public key (server.key) to talk to both. Clients use throw-away key pairs; the authenticator
accepts any client that completes the CURVE handshake (knowing the server's public key), or only
the public keys in DIR/authorized_clients/ when that folder exists.
"""

from __future__ import annotations

import os

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"


def server_keys(keys_dir) -> tuple[bytes, bytes]:
    path = os.path.join(os.fspath(keys_dir), SERVER_SECRET)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} not found: create it with zmq.auth.create_certificates({keys_dir!r}, 'server')"
        )
    public, secret = zmq.auth.load_certificate(path)
    if secret is None:  # a public-only certificate: no secret key line in the file
        raise ValueError(
            f"{path} holds no secret key: create it with zmq.auth.create_certificates({keys_dir!r}, 'server')"
        )
    return public, secret


def server_public_key(keys_dir) -> bytes:
    public, _ = zmq.auth.load_certificate(os.path.join(os.fspath(keys_dir), SERVER_PUBLIC))
    return public


def make_server(sock: zmq.Socket, keys_dir) -> bytes:
    """Turn `sock` into a CURVE server with DIR's key pair; returns the public key."""
    public, secret = server_keys(keys_dir)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return public


def make_client(sock: zmq.Socket, server_public) -> None:
    """CURVE client of a server whose public key is `server_public` (z85 bytes or str)."""
    if isinstance(server_public, str):
        server_public = server_public.encode()
    public, secret = zmq.curve_keypair()
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def start_authenticator(context: zmq.Context, keys_dir) -> ThreadAuthenticator:
    auth = ThreadAuthenticator(context)
    auth.start()
    allowed = os.path.join(os.fspath(keys_dir), "authorized_clients")
    auth.configure_curve(domain="*", location=allowed if os.path.isdir(allowed) else zmq.auth.CURVE_ALLOW_ANY)
    return auth
