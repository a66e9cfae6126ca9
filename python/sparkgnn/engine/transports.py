"""How a Spark task reaches the DL engine. A transport spec is plain data (it travels inside the
Spark closure): {"kind": "inprocess", "model_store": DIR} runs the handler inside the Spark Python
worker; the messenger plugs its own kinds into TRANSPORTS.
One transport per spec per process (handlers hold loaded models)."""
from __future__ import annotations

import json

_CACHE: dict[str, object] = {}


class InProcess:
    """Calls the DL handler directly, in this process."""

    def __init__(self, spec: dict):
        from sparkgnn.dl.handler import build_handler

        self.handler = build_handler(spec["model_store"], device=spec.get("device", "cpu"), threads=spec.get("threads", 1))

    def call(self, header: dict, tables: dict):
        return self.handler(header, tables)


TRANSPORTS = {"inprocess": InProcess}


def get_transport(spec: dict):
    key = json.dumps(spec, sort_keys=True)
    transport = _CACHE.get(key)
    if transport is None:
        kind = spec.get("kind", "inprocess")
        if kind not in TRANSPORTS:
            raise ValueError(f"unknown transport kind {kind!r}; known: {sorted(TRANSPORTS)}")
        transport = _CACHE[key] = TRANSPORTS[kind](spec)
    return transport


def spec_for(workers, model_store: str) -> dict:
    """The transport spec for infer(workers=...): "inprocess" runs layers inside Spark's Python
    workers; messenger kinds are registered by the messenger integration."""
    if isinstance(workers, dict):
        return workers
    if workers in (None, "inprocess"):
        return {"kind": "inprocess", "model_store": model_store}
    raise ValueError(f"unknown workers spec {workers!r}; use 'inprocess'")
