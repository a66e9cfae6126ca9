"""The versions an online service serves (Server.swap): a Version is one (graph directory, PE
store) pair as the front end holds it, with the count of batches still running on it; plus the
helpers a swap needs (the probe request that makes a worker load a version, a graph directory's
fingerprint, the root a store version folder lies under, a batch's header). The swap protocol
itself (open, warm every worker, switch under the dispatch lock, evict) is versions.py's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from sparkgnn.serving.online.batch_op import BATCH_OP, spec_key
from sparkgnn.serving.online.costs import GraphFacts
from sparkgnn.serving.online.pools import ServeError
from sparkgnn.serving.request import Request


class SwapRefused(ServeError):
    """Server.swap refused the new version (its store is not the graph's or the model's, a
    worker could not load it, ...); the service goes on serving the version it served."""


@dataclass(eq=False)
class Version:
    """One (graph, store) version of the deployment, as the front end holds it."""

    number: int
    graph: str
    store: str | None
    spec: dict
    facts: GraphFacts
    graph_fingerprint: str
    since: float = field(default_factory=time.time)
    in_flight: int = 0  # batches dispatched on it and not finished (guarded by the service's lock)
    replaced: bool = False
    dropped_by: dict = field(default_factory=dict)  # pool index -> pids that dropped it (evictor)

    @cached_property
    def key(self) -> str:
        """spec_key(spec), hashed once: every batch's header names it, and a SHA-256 of the
        spec's JSON per batch is a visible share of a single-query batch's dispatch."""
        return spec_key(self.spec)

    def describe(self) -> dict:
        return {
            "version": self.number,
            "graph": self.graph,
            "store": self.store,
            "graph_fingerprint": self.graph_fingerprint,
            "since": self.since,
        }


def batch_header(version: Version, mode: str, requests: list[Request]) -> dict:
    """The header of op "serve_batch" for `requests` answered in `mode` by `version`: the
    deployment travels as an id the pools registered, never as paths."""
    return {"op": BATCH_OP, "deployment": version.key, "mode": mode, "requests": [r.request_id for r in requests]}


def probe_request(facts: GraphFacts) -> Request:
    """A one-query request without edges (an id above G's): answering it loads a deployment."""
    return Request(
        "warm-up",
        np.array([facts.fresh_id()]),
        np.zeros((1, facts.feature_dim), np.float32),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )


def fingerprint_of(graph: str, compute: bool = True) -> str | None:
    """The graph directory's fingerprint: graph.json's while it describes the data files; else
    computed from the content (which reads the whole graph) or, with compute=False, None."""
    from sparkgnn.graph.dirfacts import read_trusted_meta
    from sparkgnn.pe.identity import graph_fingerprint
    from sparkgnn.pe.layout import normal_path

    meta, _ = read_trusted_meta(normal_path(graph))
    if meta and meta.get("fingerprint"):
        return str(meta["fingerprint"])
    return graph_fingerprint(graph) if compute else None


def _mode_needs(mode: str, options: dict) -> tuple[bool, bool]:
    """(reads a PE store, reads its states) for the served mode `mode` with its options: a mode
    that reads stored values has `stored`, one that recomputes from states `needs_states`; auto
    needs what its candidates (EXACT_PLANS, or its `candidates` option) need."""
    from sparkgnn.serving.modes import MODES

    if mode == "auto":
        from sparkgnn.serving.sketch import EXACT_PLANS

        candidates = (options.get("auto") or {}).get("candidates") or EXACT_PLANS.names()
        needs = [_mode_needs(str(c), options) for c in candidates if c != "auto"]
        # auto refuses to choose without a store whatever its candidates (AutoMode.choose)
        return True, any(states for _store, states in needs)
    cls = MODES.lookup(mode)
    return hasattr(cls, "stored"), bool(getattr(cls, "needs_states", False))


def deployment_problems(modes: list[str], options: dict, cache: dict, store) -> str | None:
    """Why a deployment serving `modes` (with mode options `options` and hot cache `cache`) cannot
    answer them from `store` (an opened PEStore, or None), as one line naming each mode; None
    when it can. Checked before a service starts and before a swap switches (Server), so a store
    without states never leaves EXACT and SRPE failing every request."""
    problems = []
    for mode in modes:
        needs_store, needs_states = _mode_needs(mode, options or {})
        if needs_store and store is None:
            problems.append(f"mode {mode!r} reads precomputed embeddings but no PE store is given")
        elif needs_states and not store.with_states:
            problems.append(
                f"mode {mode!r} recomputes from stored aggregation states, which {store.base} lacks "
                "(precompute the store with states)"
            )
    policy = (cache or {}).get("policy", "off")
    if policy == "fap" and int((cache or {}).get("bytes", 0)) > 0:
        if store is None:
            problems.append(
                "hot cache policy 'fap' ranks vertices by the PE store's 'fap' metrics, but no store is given"
            )
        elif "fap" not in store.metric_tables:
            have = ", ".join(store.metric_tables) or "none"
            problems.append(
                f"hot cache policy 'fap' ranks vertices by the PE store's 'fap' metrics table, which "
                f"{store.base} lacks (it has: {have}; precompute the store with workload metrics)"
            )
    return "; ".join(problems) or None


def store_root(store: str | None) -> str | None:
    """The store root a store path lies under: a version folder <root>/<graph fp>/<model fp>
    (its manifest names both) gives <root>; a root is itself."""
    if store is None:
        return None
    from sparkgnn.pe.layout import read_manifest

    manifest = read_manifest(store) or {}
    parts = str(store).rstrip("/").rsplit("/", 2)
    if len(parts) == 3 and parts[1:] == [manifest.get("graph_fingerprint"), manifest.get("model_fingerprint")]:
        return parts[0]
    return store
