"""HeteroModel: a typed GNN as per-type input ops, then typed rounds (layers/hetero.py).

    x_dict -> pre_T (per type) -> round_0 -> round_1 ... -> outputs (a dict over output types)

Each round holds one merge-aware conv per relation, the cross-relation aggregation (sum, mean,
max, min, merged exactly), the ops of types kept without incoming relations, and per-type node
ops after it. `metadata` is the typed graph the model was built for (node types, edge types in
PyG's order); a graph whose metadata differs is refused naming the difference (check_metadata).

WHY its own normal form next to Model: a homogeneous round reads one node set; a typed round
reads one per type, and the types' widths differ. Every conv is still a homogeneous layer (the
same converters, weights and exactness tests), so the typed model adds only the relation
routing and the cross-relation merge. It is described by a JSON spec plus a state_dict like
Model, so it saves, loads (weights_only) and fingerprints through models/serialization.py.

A node type without features still needs a row per node for the convs to read (PyG models need
an x for every type they read): give it a constant column (torch.ones(n, 1)), as PyG users do,
and a per-type Linear in `pre` if the convs want another width.

Converters (models/from_pyg_hetero.py): PyG's to_hetero output, HeteroConv stacks inside a model
class, RGCNConv / FastRGCNConv models over a typed graph's homogeneous form, HGTConv (one round
whose relations' partial softmax states merge per type: layers/hgt.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import cast

import torch
from torch import Tensor

from sparkgnn.decoders.base import Decoder, build_decoder
from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.hetero import EdgeType, HeteroRound, check_type_name, edge_key, resolve_relation
from sparkgnn.layers.nodeops import NodeOpStack

SPEC_FORMAT = "sparkgnn.HeteroModel"
SPEC_VERSION = 1
OUTPUTS = ("logits", "embedding")

Metadata = tuple[list[str], list[EdgeType]]


def normalize_metadata(metadata) -> Metadata:
    """PyG's metadata (node types, edge types), from a HeteroData's `metadata()` or JSON lists,
    as ([type, ...], [(src, rel, dst), ...]); ValueError for duplicates or unknown endpoint types."""
    if not isinstance(metadata, (tuple, list)) or len(metadata) != 2:
        raise ValueError("metadata must be (node types, edge types), as HeteroData.metadata() gives")
    node_types = [check_type_name(t) for t in metadata[0]]
    edge_types: list[EdgeType] = []
    for e in metadata[1]:
        if not isinstance(e, (tuple, list)) or len(e) != 3:
            raise ValueError(f"edge type {e!r} is not (src type, relation, dst type)")
        s, r, d = check_type_name(e[0]), check_type_name(e[1], "relation"), check_type_name(e[2])
        for t in (s, d):
            if t not in node_types:
                raise ValueError(f"edge type {(s, r, d)} names node type {t!r}, which the metadata does not list")
        edge_types.append((s, r, d))
    for what, items in (("node type", node_types), ("edge type", edge_types)):
        seen = [x for i, x in enumerate(items) if x in items[:i]]
        if seen:
            raise ValueError(f"metadata lists {what} {seen[0]!r} twice")
    if not node_types or not edge_types:
        raise ValueError("metadata needs at least one node type and one edge type")
    return node_types, edge_types


def metadata_difference(model: Metadata, graph: Metadata) -> str | None:
    """What differs between two metadata, in one line (None when they hold the same types)."""
    problems = []
    for what, ours, theirs in (("node types", model[0], graph[0]), ("edge types", model[1], graph[1])):
        missing = [x for x in ours if x not in theirs]
        extra = [x for x in theirs if x not in ours]
        if missing:
            problems.append(f"the graph lacks {what} {missing}")
        if extra:
            problems.append(f"the model does not know {what} {extra}")
    return "; ".join(problems) or None


class HeteroModel(torch.nn.Module):
    """A typed model in normal form (module doc). Built from a spec (weights zero until a
    state_dict is loaded) or, by the converters, from built modules (`_modules`: pre, rounds)."""

    def __init__(self, spec: dict, _modules: tuple[Mapping[str, NodeOpStack], list[HeteroRound]] | None = None):
        super().__init__()
        if not isinstance(spec, dict):
            raise ValueError("spec must be a dict")
        if spec.get("format") != SPEC_FORMAT or spec.get("version") != SPEC_VERSION:
            raise ValueError(
                f"spec format/version {spec.get('format')!r}/{spec.get('version')!r}"
                f" is not {SPEC_FORMAT!r}/{SPEC_VERSION}"
            )
        output = spec.get("output")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        meta = spec.get("metadata") or {}
        self.metadata: Metadata = normalize_metadata((meta.get("node_types", []), meta.get("edge_types", [])))
        in_dims = spec.get("in_dims")
        if not isinstance(in_dims, dict) or not in_dims:
            raise ValueError("spec needs in_dims (node type -> input width)")
        self.in_dims = {check_type_name(t): int(w) for t, w in in_dims.items()}
        if _modules is None:
            pre = {t: NodeOpStack(ops) for t, ops in (spec.get("pre") or {}).items()}
            rounds = [HeteroRound(r) for r in spec.get("rounds") or []]
        else:
            pre, rounds = dict(_modules[0]), list(_modules[1])
        if not rounds:
            raise ValueError("a typed model needs at least one round of graph convolutions")
        self.pre_ops = torch.nn.ModuleDict(pre)
        self.rounds = torch.nn.ModuleList(rounds)
        self.output = output
        self.outputs: list[str] = [check_type_name(t) for t in spec.get("outputs") or []]
        self.out_dims = self._check()
        self.spec = {
            "format": SPEC_FORMAT,
            "version": SPEC_VERSION,
            "source": spec.get("source"),
            "output": output,
            "metadata": {"node_types": self.metadata[0], "edge_types": [list(e) for e in self.metadata[1]]},
            "in_dims": dict(self.in_dims),
            "pre": {t: cast(NodeOpStack, s).config() for t, s in self.pre_ops.items()},
            "rounds": [r.config() for r in self.round_list()],
            "outputs": list(self.outputs),
            "out_dims": dict(self.out_dims),
        }
        if "out_dims" in spec and {t: int(w) for t, w in spec["out_dims"].items()} != self.out_dims:
            raise ValueError(f"spec out_dims {spec['out_dims']} != computed {self.out_dims}")
        json.dumps(self.spec, allow_nan=False)  # the spec must stay JSON (it is saved and fingerprinted)
        self.decoder: Decoder | None = None
        if spec.get("decoder") is not None:
            self.set_decoder(build_decoder(spec["decoder"]))
        self.float()
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def _check(self) -> dict[str, int]:
        node_types, edge_types = self.metadata
        for t in list(self.in_dims) + list(self.pre_ops):
            if t not in node_types:
                raise ValueError(f"node type {t!r} is not in the model's metadata {node_types}")
        for t in self.pre_ops:
            if t not in self.in_dims:
                raise ValueError(f"pre ops for node type {t!r}, which has no input width")
        dims = {
            t: cast(NodeOpStack, self.pre_ops[t]).out_dim(w) if t in self.pre_ops else w
            for t, w in self.in_dims.items()
        }
        for index, rnd in enumerate(self.round_list()):
            for e in rnd.edge_types:
                if e not in edge_types:
                    raise ValueError(f"round {index}: relation {e} is not in the model's metadata")
            dims = rnd.out_dims(dims, index)
        if not self.outputs:
            raise ValueError("a typed model needs at least one output node type")
        missing = [t for t in self.outputs if t not in dims]
        if missing:
            raise ValueError(f"output types {missing} get no value from the last round (it gives {sorted(dims)})")
        return {t: dims[t] for t in self.outputs}

    def train(self, mode: bool = True):
        """Inference only: always eval mode (dropout off, BatchNorm on running statistics)."""
        return super().train(False)

    # -- structure -------------------------------------------------------------------------
    def round_list(self) -> list[HeteroRound]:
        return [cast(HeteroRound, r) for r in self.rounds]

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def layers(self) -> list[MergeableConv]:
        """Every relation's conv of every round, in order (serialization verifies generic ones)."""
        return [conv for rnd in self.round_list() for _, conv in rnd.conv_items()]

    def check_metadata(self, metadata, where: str = "the graph") -> None:
        """Refuse (UnsupportedModelError, one line) a graph whose types differ from the model's."""
        diff = metadata_difference(self.metadata, normalize_metadata(metadata))
        if diff:
            raise UnsupportedModelError(f"the model's metadata does not match {where}'s: {diff}")

    def describe(self) -> dict:
        return copy.deepcopy(self.spec)

    def extra_repr(self) -> str:
        return f"output={self.output!r}, in_dims={self.in_dims}, out_dims={self.out_dims}"

    # -- execution -------------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self,
        x_dict: Mapping[str, Tensor],
        edge_index_dict: Mapping,
        parts: int | None = None,
        seed: int = 0,
        pre_transform: bool | None = None,
    ) -> dict[str, Tensor]:
        """Decomposed forward over typed rows and per-relation [2, E] edge lists (per-type ids):
        every relation's conv runs with its edges split into `parts` random (seeded) partitions and
        merged, the relations merged at their destination type. Equals the PyG model's eval forward
        for any `parts`. Returns the output types' rows."""
        edge_types = [tuple(e) for e in edge_index_dict]
        present = set(x_dict) | {t for e in edge_types for t in (e[0], e[2])}
        node_types = [t for t in self.metadata[0] if t in present] + sorted(present - set(self.metadata[0]))
        self.check_metadata((node_types, edge_types), where="forward's input")
        h: dict[str, Tensor] = {}
        for t, width in self.in_dims.items():
            if t not in x_dict:
                raise ValueError(
                    f"node type {t!r} has no features; the model reads {width} per node (a type "
                    "without features is given a constant column, as in PyG)"
                )
            x = torch.as_tensor(x_dict[t], dtype=torch.float32)
            if x.dim() != 2 or x.shape[1] != width:
                raise ValueError(f"node type {t!r}: features of shape {tuple(x.shape)}, the model expects [N, {width}]")
            h[t] = cast(NodeOpStack, self.pre_ops[t])(x) if t in self.pre_ops else x
        edges: dict[EdgeType, Tensor] = {}
        for e, ei in edge_index_dict.items():
            ei = torch.as_tensor(ei, dtype=torch.long)
            if ei.dim() != 2 or ei.shape[0] != 2:
                raise ValueError(f"edge type {tuple(e)}: edge_index must be [2, E], got {tuple(ei.shape)}")
            edges[cast(EdgeType, tuple(e))] = ei
        for index, rnd in enumerate(self.round_list()):
            h = rnd(h, edges, parts=parts or 1, seed=seed * 1000003 + index, pre_transform=pre_transform)
        return {t: h[t] for t in self.outputs}

    @torch.no_grad()
    def predict(self, x_dict, edge_index_dict, **kwargs) -> dict[str, Tensor]:
        """Class predictions (argmax of logits) per output type; only for output == "logits"."""
        if self.output != "logits":
            raise ValueError("predict() needs a model with output='logits'")
        return {t: y.argmax(dim=-1) for t, y in self.forward(x_dict, edge_index_dict, **kwargs).items()}

    # -- construction, persistence ---------------------------------------------------------
    @classmethod
    def from_pyg(
        cls,
        module: torch.nn.Module,
        metadata,
        output: str | None = None,
        in_dims: Mapping[str, int] | None = None,
        *,
        decoder: torch.nn.Module | Mapping[object, torch.nn.Module] | None = None,
        relations: Sequence[str] | None = None,
    ) -> HeteroModel:
        """A HeteroModel with the weights of a typed PyG model built for `metadata`
        (HeteroData.metadata()): to_hetero's output, a model class stacking HeteroConv or HGTConv,
        or an RGCNConv / FastRGCNConv model run on the graph's homogeneous form
        (models/from_pyg_hetero.py).
        `in_dims` ({type: feature width}): only needed when a type's rows go first into a conv
        with lazy in_channels, which does not tell their width. `decoder`, `relations`: a
        link-prediction decoder, converted as `Model.from_pyg` converts one and attached by
        `set_decoder` (which states how a per-relation decoder's rows name edge types); a dict or
        torch.nn.ModuleDict {edge type or key or relation name: decoder module} gives one decoder
        per relation (a per_relation decoder)."""
        from sparkgnn.models.from_pyg_hetero import convert_hetero

        model = convert_hetero(cls, module, metadata, output, in_dims)
        if decoder is not None:
            from sparkgnn.models.pyg_decoders import decoder_from_pyg

            try:
                model.set_decoder(decoder_from_pyg(decoder, relations=relations))
            except ValueError as e:
                raise UnsupportedModelError(str(e)) from None
        elif relations is not None:
            raise UnsupportedModelError("relations= names a per-relation decoder's rows; pass decoder= too")
        return model

    def set_decoder(self, decoder: Decoder) -> None:
        """Attach a link-prediction decoder (part of the spec, the weights and the fingerprint).
        It scores a pair of a relation (src type, rel, dst type) from the src type's and the dst
        type's outputs. A per-relation decoder (DistMult, TransE) holds one row per edge type: its
        `relations` name them (an edge type key `src__rel__dst`, or a relation name that only one
        edge type has), stored as keys; without names it needs one row per edge type of the
        metadata, in its order. A per_relation decoder (decoders/per_relation.py) holds one member
        decoder per relation it scores, keyed the same way and stored by key; each member must read
        the outputs of both its relation's end types. ValueError (one line) for a name that is no
        edge type, a row count that does not match, or output widths the decoder cannot read."""
        from sparkgnn.decoders import PerRelationDecoder, RelationalDecoder

        edge_types = self.metadata[1]
        scored = list(edge_types)
        if isinstance(decoder, PerRelationDecoder):
            self._set_per_relation(decoder)
            return
        if isinstance(decoder, RelationalDecoder):
            if decoder.relations is None:
                if decoder.num_relations != len(edge_types):
                    raise ValueError(
                        f"the {decoder.kind} decoder has {decoder.num_relations} relation rows but the model has "
                        f"{len(edge_types)} edge types: give one row per edge type, or relations= naming each row's"
                    )
            else:
                scored = [resolve_relation(edge_types, name) for name in decoder.relations]
                if len(set(scored)) != len(scored):
                    raise ValueError(f"the decoder's relations {list(decoder.relations)} name one edge type twice")
            decoder = copy.deepcopy(decoder)
            decoder.relations = tuple(edge_key(e) for e in scored)
        for s, _, d in scored:
            for t in (s, d):
                if t in self.out_dims:
                    decoder.check_width(self.out_dims[t], where=f"node type {t!r}'s outputs")
        self.decoder = decoder
        self.spec["decoder"] = decoder.config()

    def _set_per_relation(self, decoder) -> None:
        """set_decoder of a per_relation decoder: members re-keyed by edge type key, widths checked."""
        from sparkgnn.decoders import PerRelationDecoder

        members = {}
        for name, member in decoder.members.items():
            try:
                edge_type = resolve_relation(self.metadata[1], name)
            except ValueError as e:
                raise ValueError(f"per_relation decoder member {name!r}: {e}") from None
            key = edge_key(edge_type)
            if key in members:
                raise ValueError(f"the per_relation decoder's members name edge type {key} twice")
            for t in dict.fromkeys((edge_type[0], edge_type[2])):
                if t not in self.out_dims:
                    raise ValueError(
                        f"per_relation decoder member {key}: the model gives no outputs for node type {t!r}"
                    )
                member.check_width(self.out_dims[t], where=f"node type {t!r}'s outputs (relation {key})")
            widths = (self.out_dims[edge_type[0]], self.out_dims[edge_type[2]])
            if widths[0] != widths[1]:
                raise ValueError(
                    f"per_relation decoder member {key}: its end types' outputs have widths {widths[0]} and "
                    f"{widths[1]}; a decoder reads two node outputs of one width"
                )
            members[key] = copy.deepcopy(member)
        self.decoder = PerRelationDecoder(members=members)
        self.spec["decoder"] = self.decoder.config()

    def save(self, path) -> None:
        from sparkgnn.models.serialization import save_model

        save_model(self, path)

    @classmethod
    def load(cls, path, *, allow_modules: Sequence[str] = ()) -> HeteroModel:
        """The typed model saved at `path` (weights_only loading, no pickled code)."""
        from sparkgnn.models.serialization import load_model

        return load_model(cls, path, allow_modules=allow_modules)

    def fingerprint(self) -> str:
        from sparkgnn.models.serialization import fingerprint

        return fingerprint(self)


def is_typed_spec(spec) -> bool:
    """Whether a saved model spec is a typed model's."""
    return isinstance(spec, dict) and spec.get("format") == SPEC_FORMAT


def is_typed_model_dir(path: str) -> bool:
    """Whether the model directory `path` holds a typed model (False for an unreadable one: its
    loader says why)."""
    from sparkgnn import files
    from sparkgnn.models.serialization import MANIFEST

    try:
        return is_typed_spec(json.loads(files.read_bytes(files.join(path, MANIFEST))).get("spec"))
    except (OSError, ValueError, AttributeError):
        return False


def refuse_typed(model, job: str) -> None:
    """Refuse (UnsupportedModelError, one line) a typed model, or the directory of one, given to
    `job`, a job that runs homogeneous graphs only."""
    typed = isinstance(model, HeteroModel) or (isinstance(model, str) and is_typed_model_dir(model))
    if typed:
        raise UnsupportedModelError(
            f"{job} run homogeneous graphs only so far; a typed model (node and edge types) runs with "
            "sparkgnn.infer (batch inference) or HeteroModel.forward on a typed graph"
        )


__all__ = ["HeteroModel", "Metadata", "normalize_metadata", "metadata_difference", "refuse_typed"]
