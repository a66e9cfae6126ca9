"""The typed PE store: per round (layer) and node type, the embeddings of a typed model
(models/hetero.py) over a typed graph (graph/typed.py), for typed serving to reuse.

Layout under the store root, keyed like the homogeneous store by the typed graph's and the
model's fingerprints:

    <root>/<typed graph fp>/<model fp>/typed.json      what the store holds (below), the commit
    <root>/<typed graph fp>/<model fp>/types/<T>/...   node type T's layers: a homogeneous store
                                                       (PEWriter / PEStore) of T's ids and h^(l)

h^(l) of type T is round l's value of T after its per-type node ops (the next round's input):
exactly the PyG typed model's intermediate `x_dict[T]` after that round. A type gets a value in
rounds 1..m_T, a prefix (a round reads only types the previous round gave a value, so a type
without a value at round l has none later); its sub-store holds m_T layers. A type with no value
in any round (a source only) has no sub-store.

WHY each type is a homogeneous sub-store: a type's rows are one id space with one width per
layer, which is what PEWriter commits atomically (lease, attempts, checksums, resume) and PEStore
verifies; only the typed identity (typed.json: metadata, per-type widths) is new. Each sub-store
is keyed by the same typed graph and model fingerprints, so a sub-store copied from another
store is refused by its own check too.

Per relation nothing is stored: typed EXACT serving (serving/typed.py) and the typed refresh
(pe/typed_refresh.py) recompute an affected node's relations from its in-neighbours' stored
per-type embeddings, so aggregation states per relation are not needed. A refreshed version is
written whole under the updated graph's fingerprint, its typed.json carrying a "refresh" entry.

`typed.json` is written last ("complete": true); a store without it, or with "complete" false,
is refused on open naming what is missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sparkgnn import files
from sparkgnn.errors import SparkGNNError, StalePEStore
from sparkgnn.pe import layout
from sparkgnn.pe.identity import ModelIdentity

if TYPE_CHECKING:
    import torch

    from sparkgnn.graph.typed import TypedGraphData
    from sparkgnn.models.hetero import HeteroModel
    from sparkgnn.pe.store import PEStore

log = logging.getLogger(__name__)

TYPED_FORMAT = "sparkgnn-typed-pe/1"
TYPED_MANIFEST = "typed.json"
TYPES_FOLDER = "types"


@dataclass(frozen=True)
class _GraphIdentity:
    """What PEWriter / PEStore read of a graph (its fingerprint and sizes), for a type's sub-store."""

    fingerprint: str
    num_nodes: int = 0
    num_edges: int = 0
    feature_dim: int = 0


def _spec_sha(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def type_dims(model: HeteroModel) -> dict[str, list[int]]:
    """Per node type the widths of its h^(1..m_T) (module doc: a prefix of the rounds)."""
    from sparkgnn.layers.nodeops import NodeOpStack

    widths = {
        t: cast(NodeOpStack, model.pre_ops[t]).out_dim(w) if t in model.pre_ops else w for t, w in model.in_dims.items()
    }
    dims: dict[str, list[int]] = {}
    alive: set[str] = set(model.metadata[0])
    for index, rnd in enumerate(model.round_list()):
        widths = rnd.out_dims(widths, index)
        alive &= set(widths)
        for t in model.metadata[0]:
            if t in alive:
                dims.setdefault(t, []).append(int(widths[t]))
    return dims


def typed_model_identity(model: HeteroModel) -> dict:
    """The facts a typed store is keyed and checked by: fingerprint, spec hash, rounds, widths."""
    return {
        "model_fingerprint": model.fingerprint(),
        "model_spec_sha256": _spec_sha(model.spec),
        "num_layers": int(model.num_rounds),
        "types": type_dims(model),
    }


def typed_graph_fingerprint(graph: Any) -> str:
    """A TypedGraphData's / TypedGraph's fingerprint, or a typed graph directory's (graph.json's
    when it vouches for the files, else read and computed)."""
    if isinstance(graph, (str, os.PathLike)):
        from sparkgnn.graph import layout as graph_layout
        from sparkgnn.graph.dirfacts import trusted_meta
        from sparkgnn.graph.typed_io import read_typed_graph_dir

        path = os.fspath(graph)
        meta = trusted_meta(path, graph_layout.read_meta(path) if graph_layout.is_local(path) else None)[0]
        if meta and meta.get("fingerprint"):
            return str(meta["fingerprint"])
        return str(read_typed_graph_dir(path).fingerprint)
    return str(graph.fingerprint)


def _sub_identity(ident: dict, node_type: str) -> ModelIdentity:
    dims = tuple(ident["types"][node_type])
    return ModelIdentity(ident["model_fingerprint"], ident["model_spec_sha256"], len(dims), dims)


def _type_root(base: str, node_type: str) -> str:
    return files.join(base, TYPES_FOLDER, node_type)


def input_rows(graph: TypedGraphData, model: HeteroModel, node_type: str, rows: np.ndarray | None = None):
    """h^(0) of `node_type` (its features through the type's pre ops) at dense `rows` (None: all):
    a type whose table has no features is given the constant column of ones the model reads."""
    import torch

    from sparkgnn.layers.nodeops import NodeOpStack

    node = graph.nodes[node_type]
    width = model.in_dims[node_type]
    n = node.num_nodes if rows is None else len(rows)
    if node.feature_dim == 0 and width != 0:
        x = torch.ones(n, width)
    elif node.feature_dim != width:
        raise SparkGNNError(
            f"node type {node_type!r}: the graph's features are {node.feature_dim} wide but the model expects {width}"
        )
    else:
        x = torch.from_numpy(np.ascontiguousarray(node.x if rows is None else node.x[rows], dtype=np.float32))
    return cast(NodeOpStack, model.pre_ops[node_type])(x) if node_type in model.pre_ops else x


def typed_layer_outputs(graph: TypedGraphData, model: HeteroModel) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
    """Yield (l, {type: h^(l) [N_T, w]}) for l = 1..k over the whole typed graph (rows in each
    type's vertex table order): the typed model's rounds exactly as HeteroModel.forward runs them."""
    import torch

    h = {t: input_rows(graph, model, t) for t in model.in_dims}
    edges = {et: torch.from_numpy(np.stack(graph.edge_index(et))) for et in graph.edge_types}
    with torch.no_grad():
        for index, rnd in enumerate(model.round_list()):
            h = rnd(h, edges, parts=1, seed=index, pre_transform=False)
            yield index + 1, h


def check_typed_inputs(graph: Any, model: Any) -> None:
    """Refuse (UnsupportedModelError, one line) a typed graph and model whose metadata differ."""
    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.models.hetero import HeteroModel

    if not isinstance(model, HeteroModel):
        raise UnsupportedModelError(f"a typed graph needs a typed model (a HeteroModel), not {type(model).__name__}")
    model.check_metadata(graph.metadata(), where=f"graph {graph.name!r}")


class TypedPEWriter:
    """Commits a typed store: one PEWriter per node type (module doc), typed.json at the end.
    Types' layers already committed for the same (graph, model) are kept unless `force`."""

    def __init__(self, store_root, graph: Any, model: HeteroModel, *, force: bool = False):
        from sparkgnn.pe.writer import PEWriter

        self.ident = typed_model_identity(model)
        self.graph_fingerprint = typed_graph_fingerprint(graph)
        self.base = layout.store_dir(store_root, self.graph_fingerprint, self.ident["model_fingerprint"])
        self.metadata = model.metadata
        self.writers = {}
        for t in self.ident["types"]:
            sizes = _GraphIdentity(self.graph_fingerprint)
            self.writers[t] = PEWriter(
                _type_root(self.base, t), sizes, _sub_identity(self.ident, t), with_states=False, force=force
            )
        old = _read(self.base)
        if old is not None and (force or old.get("model_spec_sha256") != self.ident["model_spec_sha256"]):
            files.delete(files.join(self.base, TYPED_MANIFEST))  # rewritten when every type is complete

    def types_at(self, layer: int) -> list[str]:
        """The node types that have a value at `layer` (1..k)."""
        return [t for t, dims in self.ident["types"].items() if layer <= len(dims)]

    def done(self, node_type: str) -> set[int]:
        """Layers of `node_type` already committed (a resumed run skips them)."""
        return set(self.writers[node_type].completed_layers())

    def commit_arrays(self, l: int, node_type: str, ids, h) -> None:
        """Commit h^(l) of `node_type` from in-memory arrays (ids int64 [n], h float32 [n, w])."""
        self.writers[node_type].commit_layer_arrays(l, ids, h)

    def commit_frame(self, l: int, node_type: str, frame, width: int) -> None:
        """Commit h^(l) of `node_type` from a Spark DataFrame (id long, h array<float>)."""
        self.writers[node_type].commit_layer(l, frame, width)

    def finish(self, seconds: float, *, refresh: dict | None = None) -> None:
        """Finish every type's sub-store and write typed.json (the typed store's commit point).
        `refresh`: where a refreshed version came from (pe/typed_refresh.py), kept in typed.json."""
        for writer in self.writers.values():
            writer.finish({"seconds": round(seconds, 3)})
        document: dict[str, Any] = {
            "format": TYPED_FORMAT,
            "graph_fingerprint": self.graph_fingerprint,
            **self.ident,
            "metadata": {"node_types": self.metadata[0], "edge_types": [list(e) for e in self.metadata[1]]},
            "complete": True,
            "updated": layout.now(),
        }
        if refresh is not None:
            document["refresh"] = refresh
        files.write_json_atomic(files.join(self.base, TYPED_MANIFEST), document)


def _read(base: str) -> dict | None:
    try:
        document = files.read_json(files.join(base, TYPED_MANIFEST))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _missing_problem(root: str, graph_fp: str, ident: dict) -> str:
    """Why <root>/<graph fp>/<model fp> holds no typed store, in the caller's terms."""
    entries = files.entries(root) if files.kind(root) == "dir" else {}
    graphs = sorted(g for g, what in entries.items() if what == "dir" and not g.startswith("."))
    if graph_fp not in graphs:
        have = ", ".join(g[:12] for g in graphs) or "none"
        return f"graph fingerprint differs: no typed PEs for graph {graph_fp[:12]} (store has graph(s): {have})"
    models = sorted(m for m, what in files.entries(files.join(root, graph_fp)).items() if what == "dir")
    same = [
        m
        for m in models
        if (_read(files.join(root, graph_fp, m)) or {}).get("model_spec_sha256") == ident["model_spec_sha256"]
    ]
    if same:
        return (
            f"model weights differ: the store has typed PEs of the same architecture for this graph with model "
            f"fingerprint(s) {', '.join(m[:12] for m in same)}, not {ident['model_fingerprint'][:12]}"
        )
    return (
        f"model differs: no typed PEs of model {ident['model_fingerprint'][:12]} for this graph "
        f"(store has model(s): {', '.join(m[:12] for m in models) or 'none'})"
    )


class TypedPEStore:
    """A verified, complete typed store (module doc). Construct with TypedPEStore.open."""

    def __init__(self, base: str, manifest: dict, stores: dict[str, PEStore]):
        self.base = base
        self.manifest = manifest
        self.stores = stores

    @classmethod
    def open(cls, path, *, model: HeteroModel, graph: Any, verify: str = "checksums") -> TypedPEStore:
        """`path`: the store root. `model`: the HeteroModel; `graph`: a TypedGraphData, TypedGraph
        or typed graph directory. Raises StalePEStore naming what differs (graph, weights,
        architecture, a store never completed) and DamagedPEStore for damaged layers."""
        from sparkgnn.pe.store import PEStore

        ident = typed_model_identity(model)
        graph_fp = typed_graph_fingerprint(graph)
        root = layout.normal_path(path)
        base = layout.store_dir(root, graph_fp, ident["model_fingerprint"])
        if files.kind(base) != "dir":
            raise StalePEStore(f"typed PE store {root}: {_missing_problem(root, graph_fp, ident)}")
        manifest = _read(base)
        if manifest is None or not manifest.get("complete"):
            raise StalePEStore(f"typed PE store {base}: no {TYPED_MANIFEST} (the precompute never finished)")
        problems = [
            f"{key} {str(manifest.get(key))[:12]} != {str(want)[:12]}"
            for key, want in (("format", TYPED_FORMAT), ("graph_fingerprint", graph_fp), *ident.items())
            if manifest.get(key) != want
        ]
        if problems:
            raise StalePEStore(f"typed PE store {base} is stale: " + "; ".join(problems))
        stores = {
            t: PEStore.open(
                _type_root(base, t), model=_sub_identity(ident, t), graph=_GraphIdentity(graph_fp), verify=verify
            )
            for t in ident["types"]
        }
        return cls(base, manifest, stores)

    @property
    def num_layers(self) -> int:
        return int(self.manifest["num_layers"])

    def types(self, layer: int) -> list[str]:
        """The node types that have a value at `layer` (1..k)."""
        return [t for t, dims in self.manifest["types"].items() if 1 <= int(layer) <= len(dims)]

    def width(self, node_type: str, layer: int) -> int:
        return self._store(node_type, layer).width(layer)

    def _store(self, node_type: str, layer: int) -> PEStore:
        if node_type not in self.stores:
            raise SparkGNNError(f"typed PE store {self.base}: node type {node_type!r} has no stored layers")
        if layer not in self.stores[node_type].layers:
            raise SparkGNNError(
                f"typed PE store {self.base}: node type {node_type!r} has layers "
                f"{self.stores[node_type].layers}, not {layer}"
            )
        return self.stores[node_type]

    def lookup(self, node_type: str, ids, layer: int) -> np.ndarray:
        """h^(layer) of `node_type` at `ids` ([n, w] float32; UnknownIds for an id not stored)."""
        return np.asarray(self._store(node_type, layer).lookup(np.asarray(ids, dtype=np.int64), layer)[0], np.float32)

    def __repr__(self) -> str:
        return f"TypedPEStore({self.base!r}, layers={self.num_layers}, types={sorted(self.stores)})"


def precompute_typed_local(
    graph: TypedGraphData, model: HeteroModel, store_root, *, force: bool = False
) -> TypedPEStore:
    """Write h^(1..k) per node type of `model` over the in-memory typed graph into `store_root`
    and return the opened (verified) typed store. Types' layers already committed for the same
    (graph, model) are kept unless `force`."""
    check_typed_inputs(graph, model)
    started = time.perf_counter()
    writer = TypedPEWriter(store_root, graph, model, force=force)
    for l, h in typed_layer_outputs(graph, model):
        for t in writer.writers:
            if t in h and l not in writer.done(t):
                writer.commit_arrays(l, t, graph.nodes[t].ids, h[t].numpy())
    writer.finish(time.perf_counter() - started)
    log.info(
        f"sparkgnn precompute_local: typed, {model.num_rounds} rounds over {graph.num_nodes} nodes of "
        f"{len(graph.nodes)} types in {time.perf_counter() - started:.1f} s -> {writer.base}"
    )
    return TypedPEStore.open(store_root, model=model, graph=graph)


__all__ = ["TypedPEStore", "TypedPEWriter", "precompute_typed_local", "type_dims", "typed_layer_outputs"]
