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
    spec_sha: str  # sha256 of the spec alone: tells "same architecture, other weights"
    num_layers: int
    dims: tuple  # width of h^(l), l = 1..k (conv l's output after its node-wise ops)


def _spec_sha(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def model_identity(model) -> ModelIdentity:
    """From a sparkgnn Model or a saved-model path (loaded, so its checksum is verified)."""
    if isinstance(model, ModelIdentity):
        return model
    if isinstance(model, (str, os.PathLike)):
        from sparkgnn.models import Model

        model = Model.load(model)
    dims = tuple(int(model.post_ops[l].out_dim(model.conv(l).out_dim)) for l in range(model.num_rounds))
    return ModelIdentity(model.fingerprint(), _spec_sha(model.spec), int(model.num_rounds), dims)


def graph_fingerprint(graph) -> str:
    """From a Graph (anything with `.fingerprint`) or a graph directory: graph.json's fingerprint
    while it still describes the data files (graph.dirfacts), else computed from the content, so a
    directory written by another tool (GraphFrames-shaped Parquet, no graph.json) works too."""
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.dirfacts import read_trusted_meta
        from sparkgnn.graph.reader import read_graph_dir
        from sparkgnn.pe.layout import normal_path

        path = normal_path(graph)
        meta, _why = read_trusted_meta(path)
        if meta and meta.get("fingerprint"):
            return str(meta["fingerprint"])
        return str(read_graph_dir(path).fingerprint)
    return str(graph.fingerprint)


def graph_sizes(graph) -> dict:
    """num_vertices / num_edges / feature_dim for the size report (graph.json or Graph.stats())."""
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph.dirfacts import read_trusted_meta
        from sparkgnn.pe.layout import normal_path

        meta = read_trusted_meta(normal_path(graph))[0] or {}
    elif hasattr(graph, "stats"):
        meta = graph.stats()
    else:  # an in-memory GraphData
        meta = {"num_vertices": graph.num_nodes, "num_edges": graph.num_edges, "feature_dim": graph.feature_dim}
    return {k: int(meta[k]) for k in ("num_vertices", "num_edges", "feature_dim") if k in meta}
