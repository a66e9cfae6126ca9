"""Ironhouse: every messenger socket authenticates both ends with persistent CURVE keys.

A keys directory (made by `sparkgnn-keys`, keys.py) holds at most:
- `server.key` + `server.key_secret`: the servers' key pair. The broker's two sockets, every
  worker's data socket and the online service's ZeroMQ front are CURVE servers with it, so a peer
  pins exactly one public key (server.key) for all of them;
- `client.key` + `client.key_secret`: a dealer's (or a service client's) own key pair;
- `worker.key` + `worker.key_secret`: a worker's own key pair, presented to the broker's back;
- `authorized_clients/*.key`: the public keys admitted on the client-facing sockets (broker
  front, worker data sockets, the service's front);
- `authorized_workers/*.key`: the public keys admitted on the broker's back (READY and the rest).

WHY a ZAP handler of our own and not pyzmq's ThreadAuthenticator: a context holds one ZAP
endpoint, the broker and the workers share one in tests and in-process deployments, and pyzmq's
CURVE_ALLOW_ANY is one switch for every domain. Here each server socket gets its own ZAP domain
bound to one allow-list, the handler of a context is shared and reference-counted, an unknown
domain or a non-CURVE mechanism is refused, and ZAP_ENFORCE_DOMAIN makes a socket refuse
everyone when no handler answers. The check runs once per connection (the handshake); the
allow-list folder is re-read when its entries change, so `sparkgnn-keys allow` takes effect for
the next connection without a restart (a removed key keeps a connection it already has).
Secret key files must not be readable by group or others (like ssh's keys).
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import uuid
from dataclasses import dataclass

import zmq
import zmq.auth
from zmq.utils import z85

from sparkgnn.messenger.errors import SecurityError

log = logging.getLogger(__name__)

SERVER, CLIENT, WORKER = "server", "client", "worker"
ROLES = (SERVER, CLIENT, WORKER)
#: role -> the allow-list folder of the sockets that role connects to
ALLOW_DIRS = {CLIENT: "authorized_clients", WORKER: "authorized_workers"}
#: where the command lines (and LocalCluster's children) find a keys folder when not given one
KEYS_ENV = "SPARKGNN_CURVE_KEYS"
SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_ZAP_VERSION = b"1.0"


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, both halves z85 (40 bytes)."""

    public: bytes
    secret: bytes


@dataclass(frozen=True)
class ClientKeys:
    """What a connecting peer needs: its own persistent key pair and the one server key it pins
    (a server presenting any other key completes no handshake)."""

    pair: KeyPair
    server: bytes

    @classmethod
    def from_dir(cls, keys_dir: str | os.PathLike, role: str = CLIENT) -> ClientKeys:
        """`role`'s key pair and server.key from `keys_dir`, or SecurityError naming the file."""
        return cls(load_keypair(keys_dir, role), server_public_key(keys_dir))


def client_keys_for(keys_dir: str | os.PathLike | None, server_key: bytes | str | None = None) -> ClientKeys | None:
    """A connecting peer's CURVE set-up: None without keys (plain loopback); the client key pair
    of `keys_dir` pinning its server.key, or `server_key` when given (the key the caller was
    configured with wins over the folder's). A server key without a keys folder is refused: the
    servers admit only listed client keys, so a throw-away key pair would get nothing through."""
    if keys_dir is None:
        if server_key is not None:
            raise SecurityError(
                "a CURVE server key needs this client's own key pair: pass keys_dir= (a folder with "
                "client.key_secret and server.key, made by `sparkgnn-keys new client DIR`)"
            )
        return None
    if server_key is None:
        return ClientKeys.from_dir(keys_dir)
    pinned = server_key.encode() if isinstance(server_key, str) else bytes(server_key)
    return ClientKeys(load_keypair(keys_dir, CLIENT), pinned)


def public_path(keys_dir: str | os.PathLike, role: str) -> str:
    return os.path.join(os.fspath(keys_dir), f"{_role(role)}.key")


def secret_path(keys_dir: str | os.PathLike, role: str) -> str:
    return os.path.join(os.fspath(keys_dir), f"{_role(role)}.key_secret")


def allow_dir(keys_dir: str | os.PathLike, role: str) -> str:
    """The allow-list folder of the peers with `role` (client or worker)."""
    if role not in ALLOW_DIRS:
        raise ValueError(f"allow-lists exist for {', '.join(ALLOW_DIRS)}, not {role!r}")
    return os.path.join(os.fspath(keys_dir), ALLOW_DIRS[role])


def _role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"key role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


# -- files -------------------------------------------------------------------------------------
def make_keypair(keys_dir: str | os.PathLike, role: str) -> KeyPair:
    """Write `role`.key (public) and `role`.key_secret (mode 0600, created so: never readable by
    others, not even briefly) into `keys_dir` (made 0700 when missing); a server key pair also
    gets the empty allow-list folders. An existing key file is refused, never replaced: other
    hosts may have pinned or listed it."""
    folder = os.fspath(keys_dir)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    public_file, secret_file = public_path(folder, role), secret_path(folder, role)
    for path in (public_file, secret_file):
        if os.path.lexists(path):
            raise SecurityError(f"{path} exists: keys are never replaced (remove it first to make a new pair)")
    public, secret = zmq.curve_keypair()
    _write_cert(secret_file, public, secret, 0o600)
    _write_cert(public_file, public, None, 0o644)
    if role == SERVER:
        for name in ALLOW_DIRS.values():
            os.makedirs(os.path.join(folder, name), mode=0o700, exist_ok=True)
    return KeyPair(public, secret)


def allow(keys_dir: str | os.PathLike, role: str, public_file: str | os.PathLike, name: str | None = None) -> str:
    """Copy the public key in `public_file` into `keys_dir`'s allow-list for `role` (as
    `name`.key, default the file's own name); returns the listed file. A file holding a secret
    key is refused (a secret never goes into an allow-list, which may be shared)."""
    public, secret = _load_cert(public_file)
    if secret is not None:
        raise SecurityError(f"{public_file} holds a secret key: list the public file ({role}.key) instead")
    folder = allow_dir(keys_dir, role)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    base = name or os.path.splitext(os.path.basename(os.fspath(public_file)))[0]
    if not base or os.sep in base or base.startswith("."):
        raise SecurityError(f"bad allow-list name {base!r}: want a plain file name")
    target = os.path.join(folder, f"{base}.key")
    if os.path.lexists(target):
        raise SecurityError(f"{target} exists: pick another --name or remove it first")
    _write_cert(target, public, None, 0o644)
    return target


def make_full_set(keys_dir: str | os.PathLike) -> str:
    """Server, client and worker key pairs in one folder, the client and worker keys listed:
    everything one host needs to run a broker, workers and dealers (LocalCluster makes one per
    run in its private folder). Returns the folder."""
    folder = os.fspath(keys_dir)
    for role in ROLES:
        make_keypair(folder, role)
    for role in ALLOW_DIRS:
        allow(folder, role, public_path(folder, role))
    return folder


def load_keypair(keys_dir: str | os.PathLike, role: str) -> KeyPair:
    """`role`'s key pair from `keys_dir`; SecurityError when the secret file is missing, has no
    secret key, or can be read by group or others."""
    path = secret_path(keys_dir, role)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SecurityError(
            f"{path} not found: make it with `sparkgnn-keys new {role} {os.fspath(keys_dir)}`"
        ) from None
    if info.st_mode & 0o077:
        raise SecurityError(f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):04o}): `chmod 600 {path}`")
    public, secret = _load_cert(path)
    if secret is None:
        raise SecurityError(f"{path} holds no secret key: make it with `sparkgnn-keys new {role} ...`")
    return KeyPair(public, secret)


def server_public_key(keys_dir: str | os.PathLike) -> bytes:
    """The servers' public key (server.key) in `keys_dir`: what every peer pins."""
    path = public_path(keys_dir, SERVER)
    if not os.path.exists(path):
        raise SecurityError(f"{path} not found: copy the servers' server.key there (sparkgnn-keys new server)")
    return _load_cert(path)[0]


def server_keys(keys_dir: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret) of the servers' key pair."""
    pair = load_keypair(keys_dir, SERVER)
    return pair.public, pair.secret


def _load_cert(path: str | os.PathLike) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read a CURVE key from {os.fspath(path)}: {exc}") from None


def _write_cert(path: str, public: bytes, secret: bytes | None, mode: int) -> None:
    """A certificate in zmq.auth's format, created with `mode` (O_EXCL: never over a file)."""
    kind = "Secret" if secret else "Public"
    lines = [f"#   ZeroMQ CURVE {kind} Certificate (sparkgnn-keys)", "", "metadata", "curve"]
    lines.append(f'    public-key = "{public.decode()}"')
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


_listing_lock = threading.Lock()
_listings: dict[str, tuple[tuple, frozenset[bytes]]] = {}


def allowed_keys(keys_dir: str | os.PathLike, role: str) -> frozenset[bytes]:
    """The z85 public keys listed for `role` (client or worker); empty when the folder is
    missing. Re-read only when the folder's entries (names, sizes, times) changed."""
    folder = allow_dir(keys_dir, role)
    try:
        entries = sorted(
            (e.name, e.stat().st_mtime_ns, e.stat().st_size)
            for e in os.scandir(folder)
            if e.name.endswith(".key") and e.is_file()
        )
    except FileNotFoundError:
        return frozenset()
    stamp = tuple(entries)
    with _listing_lock:
        cached = _listings.get(folder)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    keys = set()
    for name, _, _ in entries:
        try:
            keys.add(_load_cert(os.path.join(folder, name))[0])
        except SecurityError as exc:
            log.warning("%s (skipped)", exc)
    listed = frozenset(keys)
    with _listing_lock:
        _listings[folder] = (stamp, listed)
    return listed


def check_server_dir(keys_dir: str | os.PathLike, roles: tuple[str, ...]) -> None:
    """Refuse (SecurityError) a keys folder a server cannot start from: no usable server key
    pair, or no allow-list folder for one of `roles`. Called where a server is configured, so
    the mistake is one line at start, not a thread that dies later."""
    load_keypair(keys_dir, SERVER)
    for role in roles:
        folder = allow_dir(keys_dir, role)
        if not os.path.isdir(folder):
            raise SecurityError(
                f"{folder} not found: list the {role}s' public keys there "
                f"(`sparkgnn-keys allow {role} {os.fspath(keys_dir)} {role}.key`)"
            )


# -- sockets -----------------------------------------------------------------------------------
def make_client(sock: zmq.Socket, keys: ClientKeys) -> None:
    """CURVE client with a persistent key pair, pinning `keys.server`."""
    sock.curve_secretkey = keys.pair.secret
    sock.curve_publickey = keys.pair.public
    sock.curve_serverkey = keys.server


def peer_key(frame: zmq.Frame) -> str | None:
    """The z85 public key of the peer that sent `frame` (the User-Id our ZAP handler gave its
    connection), or None on a socket without authentication."""
    try:
        user = frame.get("User-Id")
    except (zmq.ZMQError, KeyError):
        return None
    return user if isinstance(user, str) and user else None


class ServerAuth:
    """The servers' key pair and the ZAP handler of one context: `secure(sock, role)` makes a
    socket a CURVE server that admits only the public keys listed for `role`. close() after
    the sockets are closed (a socket without a handler then admits nobody)."""

    def __init__(self, context: zmq.Context, keys_dir: str | os.PathLike):
        self.keys_dir = os.fspath(keys_dir)
        self.pair = load_keypair(self.keys_dir, SERVER)
        self._context = context
        self._handler = _ZapHandler.acquire(context)
        self._domains: list[str] = []

    def secure(self, sock: zmq.Socket, role: str) -> None:
        """Before bind: CURVE server with the servers' key pair, admitting `role`'s allow-list.
        A missing allow-list folder is refused (create it with sparkgnn-keys): an empty one
        admits nobody, and there is no allow-anything setting."""
        check_server_dir(self.keys_dir, (role,))
        domain = f"sparkgnn-{role}-{uuid.uuid4().hex[:12]}"
        self._handler.register(domain, self.keys_dir, role)
        self._domains.append(domain)
        sock.zap_domain = domain.encode()
        if hasattr(zmq, "ZAP_ENFORCE_DOMAIN"):
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.curve_secretkey = self.pair.secret
        sock.curve_publickey = self.pair.public
        sock.curve_server = True

    def allows(self, frame: zmq.Frame, role: str) -> bool:
        """Whether `frame` came over a connection whose key is (still) listed for `role`."""
        key = peer_key(frame)
        return key is not None and key.encode() in allowed_keys(self.keys_dir, role)

    def close(self) -> None:
        for domain in self._domains:
            self._handler.unregister(domain)
        self._domains.clear()
        if self._handler is not None:
            _ZapHandler.release(self._context)
            self._handler = None  # type: ignore[assignment]


class _ZapHandler:
    """One thread answering ZAP requests of one context, shared by every ServerAuth on it."""

    _lock = threading.Lock()
    _by_context: dict[int, tuple[_ZapHandler, int]] = {}

    @classmethod
    def acquire(cls, context: zmq.Context) -> _ZapHandler:
        with cls._lock:
            handler, users = cls._by_context.get(id(context), (None, 0))
            if handler is None:
                handler = cls(context)
            cls._by_context[id(context)] = (handler, users + 1)
            return handler

    @classmethod
    def release(cls, context: zmq.Context) -> None:
        with cls._lock:
            handler, users = cls._by_context[id(context)]
            if users > 1:
                cls._by_context[id(context)] = (handler, users - 1)
                return
            del cls._by_context[id(context)]
        handler.stop()

    def __init__(self, context: zmq.Context):
        self._domains: dict[str, tuple[str, str]] = {}
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._error: SecurityError | None = None
        self._context = context
        self._thread = threading.Thread(target=self._run, name="sparkgnn-zap", daemon=True)
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            raise self._error

    def register(self, domain: str, keys_dir: str, role: str) -> None:
        self._domains[domain] = (keys_dir, role)

    def unregister(self, domain: str) -> None:
        self._domains.pop(domain, None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        sock = self._context.socket(zmq.REP)
        sock.linger = 0
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._error = SecurityError(
                f"cannot start the ZAP authenticator ({exc.strerror}): another "
                "authenticator already serves this ZeroMQ context"
            )
            sock.close(0)
            self._bound.set()
            return
        self._bound.set()
        try:
            while not self._stop.is_set():
                if sock.poll(100):
                    sock.send_multipart(self._answer(sock.recv_multipart()))
        except zmq.ContextTerminated:
            pass  # the context was destroyed under us: its sockets are gone too
        finally:
            sock.close(0)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        """A ZAP reply: 200 with the client's z85 key as User-Id, or 400 with why."""
        if len(request) < 6:
            return [_ZAP_VERSION, request[1] if len(request) > 1 else b"", b"400", b"malformed", b"", b""]
        version, request_id, domain, address, _identity, mechanism = request[:6]
        credentials = request[6:]
        policy = self._domains.get(domain.decode(errors="replace"))
        if version != _ZAP_VERSION or policy is None or mechanism != b"CURVE" or len(credentials) != 1:
            return [_ZAP_VERSION, request_id, b"400", b"not allowed", b"", b""]
        key = z85.encode(credentials[0])
        if key not in allowed_keys(*policy):
            log.warning(
                "refused a %s key not on the allow-list (%s) from %s",
                policy[1],
                key.decode(),
                address.decode(errors="replace") or "a local peer",
            )
            return [_ZAP_VERSION, request_id, b"400", b"key not allowed", b"", b""]
        return [_ZAP_VERSION, request_id, b"200", b"OK", key, b""]
