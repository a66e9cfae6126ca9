"""What a PE store is keyed and checked by: the model's and the graph's identity.

WHY a separate module: the writer and the reader must derive the SAME facts (fingerprints, layer
count, per-layer widths) from the same inputs, or a store written by one would look stale to the
other. Accepting paths as well as objects lets a serving process verify a store without building
the graph in Spark (graph.json already carries the fingerprint) or keeping the model around.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelIdentity:
    fingerprint: str
    spec_sha: str          # sha256 of the spec alone: tells "same architecture, other weights"
    num_layers: int
    dims: tuple            # width of h^(l), l = 1..k (conv l's output after its node-wise ops)


def _spec_sha(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def model_identity(model) -> ModelIdentity:
    """From a sparkgnn Model or a saved-model path (loaded, so its checksum is verified)."""
    if isinstance(model, ModelIdentity):
        return model
    if isinstance(model, (str, os.PathLike)):
        from sparkgnn.models import Model

        model = Model.load(model)
    dims = tuple(int(model.post_ops[l].out_dim(model.conv(l).out_dim)) for l in range(model.num_layers))
    return ModelIdentity(model.fingerprint(), _spec_sha(model.spec), int(model.num_layers), dims)


def graph_fingerprint(graph) -> str:
    """From a Graph (anything with `.fingerprint`) or a graph directory (graph.json, no Spark)."""
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.layout import read_meta
        from sparkgnn.pe.layout import local_path

        meta = read_meta(local_path(graph))
        if not meta or not meta.get("fingerprint"):
            raise FileNotFoundError(f"{graph}: no graph.json with a fingerprint (not a graph "
                                    "directory written by sparkgnn?)")
        return str(meta["fingerprint"])
    return str(graph.fingerprint)


def graph_sizes(graph) -> dict:
    """num_vertices / num_edges / feature_dim for the size report (graph.json or Graph.stats())."""
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.layout import read_meta
        from sparkgnn.pe.layout import local_path

        meta = read_meta(local_path(graph)) or {}
    elif hasattr(graph, "stats"):
        meta = graph.stats()
    else:                                   # an in-memory GraphData
        meta = {"num_vertices": graph.num_nodes, "num_edges": graph.num_edges,
                "feature_dim": graph.feature_dim}
    return {k: int(meta[k]) for k in ("num_vertices", "num_edges", "feature_dim") if k in meta}
