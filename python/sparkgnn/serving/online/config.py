"""ServeConfig: what a deployment of the online service serves and how (docs/ARCHITECTURE.md
"Online serving"), loaded from and saved as JSON, and checked as a whole when loaded: unknown
settings, wrong types and out-of-range values are one line each (`sparkgnn-serve` exits 2 on them).
Also the HTTP front's HOST:PORT parsing (split_http_bind), which the config's check shares.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from sparkgnn.serving.online.pools import POOL_KINDS, ROUTERS, ServeError
from sparkgnn.serving.online.scheduler import SCHEDULERS
from sparkgnn.serving.online.sharded import SHARD_TRANSPORTS, replicas_of, sharded_problem

CHEAP_MODES = ("he", "srpe")  # the reuse modes a deployment serves unless it lists others


@dataclass
class ServeConfig:
    """A deployment: what to serve and how. Saved as JSON (`sparkgnn-serve tune` writes the
    tuned thresholds into it)."""

    graph: str
    model: str
    store: str | None = None
    mode: str = "he"
    # the modes served, chosen explicitly (the default `mode` is always among them): by default the
    # cheap reuse modes; FULL, NS and EXACT cost a request orders of magnitude more and are served
    # only where a deployment lists them
    modes: list[str] = field(default_factory=lambda: list(CHEAP_MODES))
    mode_options: dict = field(default_factory=dict)
    scheduler: str = "degree"
    t_d: float = 4096.0
    t_s: int = 0
    capacity: int = 4096
    max_batch: int = 1024
    max_wait_factor: float = 4.0
    # express lanes next to an in-process pool's slots (dispatch.py): lane k serves requests
    # predicted at most max_wait_factor**k x a cost-1 request's service, so a cheap request never
    # waits behind an expensive batch in service; 0: none
    express_lanes: int = 3
    pools: list[dict] = field(default_factory=lambda: [{"name": "main", "kind": "inprocess", "width": 1}])
    router: str = "first"
    route_psgs: float | None = None
    # the hot cache, off unless asked for: the serving kernels run on the CPU, so a CUDA cache's rows
    # come back with .cpu() on every gather and a CPU cache duplicates host rows (README)
    cache: dict = field(default_factory=lambda: {"policy": "off", "bytes": 0})
    bind: str = "tcp://127.0.0.1:0"
    http: str | None = "127.0.0.1:0"
    curve_keys: str | None = None
    token: str | None = None
    admin_token: str | None = None  # admin operations (swap) need it; never the inference token
    swap_roots: list[str] = field(default_factory=list)  # a swap's graph and store must lie under one
    swap_schemes: list[str] = field(default_factory=lambda: ["file"])  # URI schemes a swap may name
    # swap to each version a follower publishes under the store's root (serving/online/store_follow.py),
    # checked every follow_interval_s: freshness = the follower's commit interval + this + the swap
    follow_store: bool = False
    follow_interval_s: float = 0.5
    tls_cert: str | None = None  # PEM certificate chain of the HTTP front (HTTPS)
    tls_key: str | None = None  # its PEM private key
    max_queries: int = 4096
    max_edges: int = 131072
    max_cost: float = 4194304.0  # a request's predicted cost (GraphFacts.pending: in-degree sum)
    max_body_bytes: int = 64 * 1024 * 1024  # an HTTP body and a ZeroMQ message (MAXMSGSIZE)
    queue_bytes: int = 1 << 30  # the queued requests' bytes (ids, features, edges) at most
    parse_threads: int = 2  # threads decoding and validating requests (both fronts), off their intake
    parse_queue: int = 64  # requests waiting for those threads at most (beyond: 503 / BUSY, retry later)
    request_timeout_s: float = 30.0
    # a request's deadline unless it names its own (admission.py): one whose predicted queue wait
    # and service pass it is refused at intake (BUSY, HTTP 503 + Retry-After); None: request_timeout_s
    deadline_ms: float | None = None
    metrics_auth: str = "inference"  # GET /metrics needs: "inference" (as /v1/health) or "admin" (the admin token)
    batch_timeout_s: float = 120.0  # a batch's pool call: its requests are answered "timeout" after it
    http_idle_timeout_s: float = 30.0
    # HTTP front processes: the service's own plus fronts - 1 processes on the same port (SO_REUSEPORT),
    # each parsing and answering in its own GIL and relaying requests to the service (fronts.py)
    fronts: int = 1

    @classmethod
    def load(cls, path: str) -> ServeConfig:
        """The deployment in the JSON file `path`; ServeError (one line naming the file and the
        setting) for malformed JSON, a file that is not one object, an unknown setting, a wrong
        type or a value out of range (ServeConfig.check)."""
        import json

        import msgspec

        from sparkgnn.files import read_bytes

        try:
            data = json.loads(read_bytes(path))
        except (ValueError, RecursionError) as exc:
            raise ServeError(f"{path}: not JSON ({' '.join(str(exc).split()) or type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ServeError(f"{path}: a deployment is one JSON object of settings, not a {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ServeError(
                f"{path}: unknown deployment settings {unknown}; known: {', '.join(sorted(cls.__dataclass_fields__))}"
            )
        try:
            config = msgspec.convert(data, cls, strict=True)
        except msgspec.ValidationError as exc:
            raise ServeError(f"{path}: {_setting_error(exc)}") from None
        return config.check(path)

    def check(self, where: str = "deployment") -> ServeConfig:
        """Refuse (ServeError, one line) settings of the right type but out of range: sizes and
        widths < 1, non-finite or non-positive seconds, an unknown scheduler, router or pool kind,
        malformed pool specs, a malformed HTTP bind."""
        from sparkgnn.serving.modes import MODES

        for name in (
            "capacity",
            "max_batch",
            "max_queries",
            "max_edges",
            "max_body_bytes",
            "queue_bytes",
            "parse_threads",
            "parse_queue",
            "fronts",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ServeError(f"{where}: {name} must be an integer >= 1, got {value!r}")
        for name in (
            "t_d",
            "max_wait_factor",
            "max_cost",
            "request_timeout_s",
            "batch_timeout_s",
            "http_idle_timeout_s",
            "follow_interval_s",
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ServeError(f"{where}: {name} must be a finite number > 0, got {value!r}")
        value = self.deadline_ms
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0)
        ):
            raise ServeError(f"{where}: deadline_ms must be a finite number > 0 (or null), got {value!r}")
        if isinstance(self.express_lanes, bool) or not isinstance(self.express_lanes, int) or self.express_lanes < 0:
            raise ServeError(f"{where}: express_lanes must be an integer >= 0 (0: none), got {self.express_lanes!r}")
        if isinstance(self.t_s, bool) or not isinstance(self.t_s, int) or self.t_s < 0:
            raise ServeError(f"{where}: t_s must be an integer >= 0 (0: batches are never divided), got {self.t_s!r}")
        if not isinstance(self.modes, list) or not self.modes or not all(isinstance(m, str) for m in self.modes):
            raise ServeError(f"{where}: modes must be a non-empty list of mode names, got {self.modes!r}")
        for mode in [self.mode, *self.modes]:
            MODES.lookup(mode)
        SCHEDULERS.lookup(self.scheduler)
        ROUTERS.lookup(self.router)
        if not isinstance(self.cache, dict) or set(self.cache) - {"policy", "bytes", "device"}:
            raise ServeError(f"{where}: cache must be an object with policy, bytes, device; got {self.cache!r}")
        from sparkgnn.serving.online.hotcache import CACHE_POLICIES

        CACHE_POLICIES.lookup(str(self.cache.get("policy", "off")))
        if not isinstance(self.pools, list) or not self.pools:
            raise ServeError(f"{where}: pools must be a non-empty list of pool specs, got {self.pools!r}")
        for spec in self.pools:
            _check_pool(spec, where)
        problem = sharded_problem(self)
        if problem:
            raise ServeError(f"{where}: {problem}")
        if self.http:
            split_http_bind(self.http)
        elif self.fronts > 1:
            raise ServeError(f"{where}: fronts={self.fronts} needs the HTTP front (http): the extra fronts serve HTTP")
        for name in ("swap_roots", "swap_schemes"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ServeError(f"{where}: {name} must be a list of non-empty strings, got {value!r}")
        if not isinstance(self.follow_store, bool):
            raise ServeError(f"{where}: follow_store must be true or false, got {self.follow_store!r}")
        if self.follow_store and not self.store:
            raise ServeError(f"{where}: follow_store needs a PE store (store): it follows that store's versions")
        if self.metrics_auth not in ("inference", "admin"):
            raise ServeError(f"{where}: metrics_auth must be 'inference' or 'admin', got {self.metrics_auth!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ServeError(f"{where}: HTTPS needs both tls_cert and tls_key, got only one")
        if self.admin_token is not None and self.admin_token == self.token:
            raise ServeError(f"{where}: admin_token must differ from token (an inference client must not administer)")
        return self

    def save(self, path: str) -> None:
        """Write the deployment as JSON (atomically: a reader sees the old file or the new one).
        A local file keeps its permission bits: a 0600 config, which may hold tokens, stays 0600."""
        import json
        import os
        import stat
        import uuid

        from sparkgnn.files import write_json_atomic

        text = str(path)
        if "://" in text and not text.startswith("file:"):
            write_json_atomic(path, asdict(self))
            return
        local = text.removeprefix("file://") if text.startswith("file://") else text.removeprefix("file:")
        try:
            mode = stat.S_IMODE(os.stat(local).st_mode)
        except FileNotFoundError:
            mode = 0o600  # a new config may hold tokens
        folder = os.path.dirname(os.path.abspath(local))
        temporary = os.path.join(folder, f".{os.path.basename(local)}.{uuid.uuid4().hex}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)  # the umask does not narrow it, nor widen it
            with os.fdopen(fd, "wb") as fh:
                fh.write(json.dumps(asdict(self)).encode())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, local)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise

    def deadline_s(self, deadline_ms: float | None = None) -> float:
        """A request's deadline in seconds: its own `deadline_ms`, else the deployment's, else
        the request timeout."""
        given = deadline_ms if deadline_ms is not None else self.deadline_ms
        return float(given) / 1e3 if given is not None else float(self.request_timeout_s)

    def deployment(self, graph: str | None = None, store: str | None = None) -> dict:
        """What a worker needs to load (batch_op.Deployment); the cache key of its copy. `graph`
        and `store`: another version of the same deployment (Server.swap)."""
        return {
            "graph": self.graph if graph is None else graph,
            "model": self.model,
            "store": self.store if graph is None else store,
            "options": self.mode_options,
            "cache": self.cache,
        }


def over_caps(request, max_queries: int, max_edges: int) -> str | None:
    """Why `request` (a serving.request.Request) has more query nodes or edges than the caps, as
    one line, or None. The service (Server.oversize) and the streaming job refuse alike."""
    if request.batch_size > max_queries:
        return (
            f"request {request.request_id!r} has {request.batch_size} query nodes; this service "
            f"takes at most {max_queries} per request (split it)"
        )
    if request.num_edges > max_edges:
        return (
            f"request {request.request_id!r} has {request.num_edges} edges; this service takes at "
            f"most {max_edges} per request (split it)"
        )
    return None


def swap_path(path: str, roots: list[str], schemes: list[str]) -> str | None:
    """`path` as a swap may open it, or None when it may not: a local path (or file: URI) must
    resolve (os.path.realpath: links and `..` followed) under the realpath of one of `roots` and
    exist; a URI must have a scheme of `schemes`, no `..` segment, and lie under one of `roots`
    with that scheme. The same None for a path outside the roots and a missing one, so a refusal
    tells a caller nothing about which paths exist."""
    import os
    import posixpath

    text = str(path)
    scheme, sep, rest = text.partition("://")
    allowed = {s.lower() for s in schemes}
    if sep and scheme.lower() != "file":
        if scheme.lower() not in allowed or ".." in rest.split("/"):
            return None
        wanted = f"{scheme.lower()}://{posixpath.normpath(rest)}"
        for root in roots:
            r_scheme, r_sep, r_rest = root.partition("://")
            if r_sep and r_scheme.lower() == scheme.lower():
                base = f"{r_scheme.lower()}://{posixpath.normpath(r_rest)}".rstrip("/")
                if wanted == base or wanted.startswith(base + "/"):
                    return wanted
        return None
    if "file" not in allowed:
        return None
    local = rest if sep else text.removeprefix("file:") if text.startswith("file:") else text
    real = os.path.realpath(local)
    for root in roots:
        if "://" in root and not root.startswith("file://"):
            continue
        base = os.path.realpath(root.removeprefix("file://"))
        if (real == base or real.startswith(base.rstrip(os.sep) + os.sep)) and os.path.exists(real):
            return real
    return None


POOL_SETTINGS: dict[str, type] = {
    "name": str,
    "kind": str,
    "width": int,
    "threads": int,
    "device": str,
    "timeout_s": float,
    "transport": str,  # a "workers" pool's route to its workers (WorkerPool): "ipc" or "tcp" (CURVE-keyed)
    "shards": int,  # a "sharded" pool's shard workers (serving.online.sharded)
    "memory_budget_bytes": int,  # a "sharded" pool's bytes of shard rows per worker at most
    "replicas": list,  # a "sharded" pool's workers per shard: an int for all, or one per shard (replicas_of)
}
POOL_TRANSPORTS = ("ipc", "tcp")
SHARDED_ONLY = ("shards", "memory_budget_bytes", "replicas")


def _check_pool(spec, where: str) -> None:
    """One pool spec: an object with a name, a known kind, known settings of their types, and
    width, threads and timeout_s >= 1 (a pool of 0 workers would never answer); `transport`, only
    on a "workers" pool (one of POOL_TRANSPORTS) or a "sharded" one (sharded.SHARD_TRANSPORTS);
    `shards` (required), `memory_budget_bytes` and `replicas` only on a "sharded" pool."""
    if not isinstance(spec, dict):
        raise ServeError(f"{where}: a pool is an object {{name, kind, width, ...}}, got {spec!r}")
    unknown = sorted(set(spec) - set(POOL_SETTINGS))
    if unknown:
        raise ServeError(
            f"{where}: pool {spec.get('name')!r} has unknown settings {unknown}; known: {sorted(POOL_SETTINGS)}"
        )
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ServeError(f'{where}: every pool needs a "name", got {spec!r}')
    for key, kind in POOL_SETTINGS.items():
        value = spec.get(key)
        if value is None or key == "replicas":  # an int or a list: checked below, by replicas_of
            continue
        types = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) or not isinstance(value, types):
            raise ServeError(f"{where}: pool {spec['name']!r}: {key} must be {kind.__name__}, got {value!r}")
        if isinstance(value, int | float) and not (math.isfinite(value) and value >= 1):
            raise ServeError(f"{where}: pool {spec['name']!r}: {key} must be >= 1, got {value!r}")
    kind = spec.get("kind", "inprocess")
    transports = SHARD_TRANSPORTS if kind == "sharded" else POOL_TRANSPORTS
    transport = spec.get("transport", "ipc")
    if transport not in transports:
        raise ServeError(
            f"{where}: pool {spec['name']!r}: transport must be one of {', '.join(transports)}, got {transport!r}"
        )
    if "transport" in spec and kind not in ("workers", "sharded"):
        raise ServeError(
            f"{where}: pool {spec['name']!r}: transport applies to a 'workers' pool or a 'sharded' one only"
        )
    for key in SHARDED_ONLY:
        if key in spec and kind != "sharded":
            raise ServeError(f"{where}: pool {spec['name']!r}: {key} applies to a 'sharded' pool only")
    if kind == "sharded" and "shards" not in spec:
        raise ServeError(f"{where}: pool {spec['name']!r}: a 'sharded' pool needs shards (its shard workers, >= 1)")
    if "replicas" in spec and kind == "sharded":
        try:
            replicas_of(spec["replicas"], spec["shards"], spec["name"])
        except ServeError as exc:
            raise ServeError(f"{where}: {exc}") from None
    POOL_KINDS.lookup(spec.get("kind", "inprocess"))


def _setting_error(exc: Exception) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.capacity`" as "capacity: expected int, got str"."""
    text = str(exc)
    what, _sep, at = text.partition(" - at `$")
    name = at.rstrip("`").lstrip(".") or "the settings"
    return f"{name}: {what[:1].lower()}{what[1:].replace('`', '')}"


def split_http_bind(bind: str) -> tuple[str, int]:
    """HOST:PORT of the HTTP front as (host, port); ServeError unless the port is 0..65535
    (0: any free port) and the host is given."""
    text = str(bind)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ServeError(f"HTTP bind {text!r} must be HOST:PORT with a port in 0..65535 (0: any free port)")
    return host.strip("[]") if host.startswith("[") else host, int(port)
