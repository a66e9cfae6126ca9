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


@dataclass
class ServeConfig:
    """A deployment: what to serve and how. Saved as JSON (`sparkgnn-serve tune` writes the
    tuned thresholds into it)."""

    graph: str
    model: str
    store: str | None = None
    mode: str = "he"
    modes: list[str] = field(default_factory=lambda: ["full", "ns", "he", "srpe", "exact"])
    mode_options: dict = field(default_factory=dict)
    scheduler: str = "degree"
    t_d: float = 4096.0
    t_s: int = 0
    capacity: int = 4096
    max_batch: int = 1024
    max_wait_factor: float = 4.0
    pools: list[dict] = field(default_factory=lambda: [{"name": "main", "kind": "inprocess", "width": 1}])
    router: str = "first"
    route_psgs: float | None = None
    cache: dict = field(default_factory=lambda: {"policy": "off", "bytes": 0})
    bind: str = "tcp://127.0.0.1:0"
    http: str | None = "127.0.0.1:0"
    curve_keys: str | None = None
    token: str | None = None
    max_queries: int = 4096
    max_edges: int = 131072
    request_timeout_s: float = 30.0
    http_idle_timeout_s: float = 30.0

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

        for name in ("capacity", "max_batch", "max_queries", "max_edges"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ServeError(f"{where}: {name} must be an integer >= 1, got {value!r}")
        for name in ("t_d", "max_wait_factor", "request_timeout_s", "http_idle_timeout_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ServeError(f"{where}: {name} must be a finite number > 0, got {value!r}")
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
        if self.http:
            split_http_bind(self.http)
        return self

    def save(self, path: str) -> None:
        from sparkgnn.files import write_json_atomic

        write_json_atomic(path, asdict(self))

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


POOL_SETTINGS: dict[str, type] = {
    "name": str,
    "kind": str,
    "width": int,
    "threads": int,
    "device": str,
    "timeout_s": float,
}


def _check_pool(spec, where: str) -> None:
    """One pool spec: an object with a name, a known kind, known settings of their types, and
    width, threads and timeout_s >= 1 (a pool of 0 workers would never answer)."""
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
        if value is None:
            continue
        types = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) or not isinstance(value, types):
            raise ServeError(f"{where}: pool {spec['name']!r}: {key} must be {kind.__name__}, got {value!r}")
        if isinstance(value, int | float) and not (math.isfinite(value) and value >= 1):
            raise ServeError(f"{where}: pool {spec['name']!r}: {key} must be >= 1, got {value!r}")
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
