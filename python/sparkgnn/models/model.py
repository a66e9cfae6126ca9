"""Model: a GNN as a chain of merge-aware convs with node-wise ops in between.

    x -> pre -> conv_0 -> post_0 -> conv_1 -> post_1 ... conv_{L-1} -> post_{L-1} -> output

WHY this normal form: the executor runs one conv per dataflow round (scatter, collect, merge,
update) and everything between two convs is node-wise, so it can be fused into the same worker
call as the preceding `update`. Any supported PyG model (BasicGNN, Sequential stacks) is brought
into this form by `from_pyg`, which copies weights into sparkgnn's own modules: the model never
aliases the user's PyG module, is always float32 and always in eval mode, and is described by a
JSON `spec` plus a state_dict, so it can be saved, loaded with `weights_only=True`, and
fingerprinted (the PE store and the messenger use the fingerprint to refuse stale or foreign
results).

`convs` are the model's ROUNDS, one per pass over the in-edges: a layer whose aggregator takes
several passes (the normalized moments: the mean, then the centred powers) is expanded into one
round per pass (layers/phases.py), the earlier rounds with no post ops. Every executor, the
planner, serving and the PE store see the rounds (`num_rounds` counts them, and a PE store keeps
one stored layer per round); the spec keeps the layers as written (`layers`, counted by
`num_layers`), so a saved model rebuilds the same rounds.

Skip connections make the chain a small DAG: node ops `save` and `combine` (layers/dag.py) let a
later op read an earlier value (residual adds, concatenation, JumpingKnowledge). Such a model
(`is_dag`) runs its rounds over rows that carry each saved value from its save to its last read
(CarryRound, CarryStack); a model without them is built exactly as a chain, so its spec, state_dict
and fingerprint do not change.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from sparkgnn.decoders.base import Decoder, build_decoder
from sparkgnn.layers.base import MergeableConv, build_conv, choose_pre_transform, propagate
from sparkgnn.layers.dag import carry_rounds, has_dag_ops
from sparkgnn.layers.nodeops import NodeOpStack
from sparkgnn.layers.phases import expand_passes
from sparkgnn.layers.rowwise import rows_independent

SPEC_FORMAT = "sparkgnn.Model"
SPEC_VERSION = 1
OUTPUTS = ("logits", "embedding")


class Model(torch.nn.Module):
    pre_ops: NodeOpStack

    def __init__(self, spec: dict, _modules=None):
        """Build from a spec (weights zero until a state_dict is loaded). `_modules` (pre, convs,
        posts) is used by `from_pyg`, which has already built the modules with copied weights."""
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
        if _modules is None:
            if len(spec["post"]) != len(spec["convs"]):
                raise ValueError("spec needs one 'post' list per conv")
            pre = NodeOpStack(spec["pre"])
            convs = [build_conv(c) for c in spec["convs"]]
            posts = [NodeOpStack(p) for p in spec["post"]]
        else:
            pre, convs, posts = _modules
        if not convs:
            raise ValueError("a model needs at least one graph convolution")
        if len(posts) != len(convs):
            raise ValueError("a model needs one post-op stack per conv")
        # The spec's layers, as written (describe(), save); `convs` are the rounds that run them.
        self.layers: list[MergeableConv] = list(convs)
        rounds, round_posts = [], []
        for conv, post in zip(convs, posts, strict=True):
            expanded = expand_passes(conv)
            rounds += expanded
            round_posts += [NodeOpStack() for _ in expanded[:-1]] + [post]
        self.in_dim = int(spec["in_dim"])
        # skip connections: rows carry saved values between rounds (layers/dag.py, module doc)
        self.is_dag = has_dag_ops([pre, *posts])
        if self.is_dag:
            pre, rounds, round_posts = carry_rounds(self.in_dim, pre, rounds, round_posts)
        self.pre_ops = pre
        self.convs = torch.nn.ModuleList(rounds)
        self.post_ops = torch.nn.ModuleList(round_posts)
        self.output = output
        self.out_dim = self._check_dims()
        self.spec = {
            "format": SPEC_FORMAT,
            "version": SPEC_VERSION,
            "source": spec.get("source"),
            "output": output,
            "in_dim": self.in_dim,
            "out_dim": self.out_dim,
            "pre": self.pre_ops.config(),
            "convs": [c.config() for c in self.layers],
            "post": [p.config() for p in posts],
        }
        if "out_dim" in spec and int(spec["out_dim"]) != self.out_dim:
            raise ValueError(f"spec out_dim {spec['out_dim']} != computed {self.out_dim}")
        self.decoder: Decoder | None = None
        if spec.get("decoder") is not None:
            self.set_decoder(build_decoder(spec["decoder"]))
        self.float()
        for p in self.parameters():
            p.requires_grad_(False)
        super().train(False)

    def _check_dims(self) -> int:
        dim = self.pre_ops.out_dim(self.in_dim)
        for l, (conv, post) in enumerate(zip(self.conv_list(), self.post_list(), strict=True)):
            if conv.in_dim != dim:
                raise ValueError(f"conv {l} ({conv.kind}) expects width {conv.in_dim}, gets {dim}")
            dim = post.out_dim(conv.out_dim)
        return dim

    def train(self, mode: bool = True):
        """Inference only: the model stays in eval mode whatever is asked (dropout off,
        BatchNorm on running statistics), because exactness against PyG eval depends on it."""
        return super().train(False)

    # -- structure -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """The layers as the user wrote them (the spec's convs)."""
        return len(self.layers)

    @property
    def num_rounds(self) -> int:
        """The engine's rounds, one pass over the in-edges each: a layer whose aggregator takes
        several passes (the normalized moments) counts once per pass (module doc). Layer indices
        everywhere in the engine, serving and the PE store are round indices."""
        return len(self.convs)

    def conv(self, l: int) -> MergeableConv:
        return cast(MergeableConv, self.convs[l])

    def conv_list(self) -> list[MergeableConv]:
        """The convs in order, typed (a ModuleList hands a type checker plain Modules)."""
        return [cast(MergeableConv, c) for c in self.convs]

    def post_list(self) -> list[NodeOpStack]:
        """The node-wise op stacks after each conv, typed like conv_list."""
        return [cast(NodeOpStack, p) for p in self.post_ops]

    def pre(self, x: Tensor) -> Tensor:
        return self.pre_ops(x)

    def post(self, l: int, h: Tensor) -> Tensor:
        return cast(NodeOpStack, self.post_ops[l])(h)

    def plan_info(self) -> list[dict]:
        """Each conv's plan_info plus `range_wise`: whether the DL step aggregates it by sparse
        products and runs its update and post ops on destination ranges (dl/step.py), which the
        planner's memory rule counts (planner.partitions)."""
        posts = self.post_list()
        return [
            {"index": l, **conv.plan_info(), "range_wise": self._range_wise(conv, posts[l])}
            for l, conv in enumerate(self.conv_list())
        ]

    @staticmethod
    def _range_wise(conv: MergeableConv, post: torch.nn.Module) -> bool:
        sums_path = conv.aggregator.from_sums and all(conv.message_scale(None, pre)[0] for pre in (False, True))
        return bool(sums_path and rows_independent(conv, post))

    @property
    def edge_attr_dim(self) -> int:
        """Width of the edge attributes the model's convs read (0: none reads any)."""
        return max((conv.edge_attr_dim for conv in self.conv_list()), default=0)

    def check_edge_attr(self, width: int | None, where: str = "the graph") -> None:
        """Refuse (ValueError, one line) edge attributes this model cannot read: none given
        (width None) to a model whose convs read them, or attributes of another width."""
        readers = [(l, c) for l, c in enumerate(self.conv_list()) if c.edge_attr_dim]
        if readers and width is None:
            kinds = sorted({c.kind for _, c in readers})
            raise ValueError(
                f"the model's {', '.join(kinds)} layers read edge features (edge_attr, width "
                f"{self.edge_attr_dim}) but {where} has none (no edges/edge_attr column)"
            )
        for l, conv in readers:
            if conv.edge_attr_dim != width:
                raise ValueError(
                    f"layer {l + 1} ({conv.kind}) reads edge_attr of width {conv.edge_attr_dim} "
                    f"but {where} has width {width}"
                )
        for l, conv in enumerate(self.conv_list()):
            if width is not None and getattr(conv, "ambiguous_edge_dim", None) == width:
                raise ValueError(
                    f"layer {l + 1} ({conv.kind}) was converted from a GENConv on its own, which adds "
                    f"edge_attr of width {width} to its messages only when its call passes them, and {where} "
                    f"carries edge_attr of width {width}: convert it with its call, e.g. "
                    "torch_geometric.nn.Sequential('x, edge_index, edge_attr', [(conv, 'x, edge_index, "
                    "edge_attr -> x')]) to read them or ('x, edge_index', ...) to leave them out"
                )

    # -- execution -------------------------------------------------------------------------
    @staticmethod
    def choose_pre_transform(conv: MergeableConv) -> bool:
        """Default mode when the caller does not force one (layers.base.choose_pre_transform)."""
        return choose_pre_transform(conv)

    @torch.no_grad()
    def forward(
        self,
        x,
        edge_index,
        edge_weight=None,
        parts: int | None = None,
        seed: int = 0,
        pre_transform: bool | None = None,
        edge_attr=None,
    ) -> Tensor:
        """Decomposed forward: every conv goes through the partial/merge path with the edges
        split into `parts` random (seeded) partitions. Equals the PyG model's eval forward for
        any `parts`. `pre_transform` forces a mode for every layer (None: per-layer default).
        `edge_attr` [E, D]: the edge features the convs with edge_dim read (refused when missing)."""
        x = torch.as_tensor(x, dtype=torch.float32)
        edge_index = torch.as_tensor(edge_index, dtype=torch.long)
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index must be [2, E], got {tuple(edge_index.shape)}")
        if edge_weight is not None:
            edge_weight = torch.as_tensor(edge_weight, dtype=torch.float32)
        if edge_attr is not None:
            edge_attr = torch.as_tensor(edge_attr, dtype=torch.float32).reshape(edge_index.shape[1], -1)
        self.check_edge_attr(None if edge_attr is None else int(edge_attr.shape[1]), where="forward's input")
        h = self.pre(x)
        for l, conv in enumerate(self.conv_list()):
            pre = self.choose_pre_transform(conv) if pre_transform is None else bool(pre_transform)
            h = propagate(
                conv,
                h,
                edge_index[0],
                edge_index[1],
                edge_weight,
                parts=parts or 1,
                seed=seed * 1000003 + l,
                pre_transform=pre,
                edge_attr=edge_attr if conv.edge_attr_dim else None,
            )
            h = self.post(l, h)
        return h

    @torch.no_grad()
    def predict(self, x, edge_index, edge_weight=None, **kwargs) -> Tensor:
        """Class predictions (argmax of logits); only for output == "logits"."""
        if self.output != "logits":
            raise ValueError("predict() needs a model with output='logits'")
        return self.forward(x, edge_index, edge_weight, **kwargs).argmax(dim=-1)

    # -- construction, persistence ---------------------------------------------------------
    @classmethod
    def from_pyg(
        cls,
        module: torch.nn.Module,
        output: str | None = None,
        *,
        decoder: torch.nn.Module | None = None,
        relations: Sequence[str] | None = None,
    ) -> Model:
        """A Model with the weights of a PyTorch Geometric module (models.from_pyg). `output`:
        "logits" (a classifier: results carry `pred`, the argmax) or "embedding"; None infers it
        from the module's last layer (from_pyg.infer_output states the rule) and logs the choice.
        `decoder`: a link-prediction decoder module, `decoder(h_src, h_dst) -> [N]` scores over the
        model's node outputs (sparkgnn.decoders: dot, cosine, MLP on concat / hadamard / difference),
        traced and saved with the model; its input width must equal the model's output width. A
        per-relation decoder (DistMult, TransE: `decoder(z, edge_index, edge_type)` as PyG's
        rgcn_link_pred.py writes it) scores each pair with its relation; `relations` names the
        relations (its table's rows, in order) so pairs may name them instead of indexing."""
        from sparkgnn.models.from_pyg import convert

        model = convert(cls, module, output)
        if decoder is not None:
            from sparkgnn.errors import UnsupportedModelError
            from sparkgnn.models.pyg_decoders import decoder_from_pyg

            try:
                model.set_decoder(decoder_from_pyg(decoder, relations=relations))
            except ValueError as e:
                raise UnsupportedModelError(str(e)) from None
        return model

    def set_decoder(self, decoder: Decoder) -> None:
        """Attach a link-prediction decoder (part of the spec, the weights and the fingerprint);
        ValueError (one line) when its input width is not the model's output width, or for a
        per_relation decoder (one per edge type: typed models only)."""
        if decoder.kind == "per_relation":
            raise ValueError(
                "a per_relation decoder (one decoder per edge type) is for typed models: "
                "HeteroModel.from_pyg(module, metadata, decoder={edge_type: decoder})"
            )
        decoder.check_width(self.out_dim, where=f"the model's outputs (out_dim {self.out_dim})")
        self.decoder = decoder
        self.spec["decoder"] = decoder.config()

    @torch.no_grad()
    def score(self, h_src, h_dst, rel=None) -> Tensor:
        """[N] scores of node pairs from their node outputs, by the model's decoder; `rel`: each
        pair's relation (index or name), for a per-relation decoder only."""
        if self.decoder is None:
            raise ValueError("the model has no decoder: convert it with Model.from_pyg(encoder, decoder=module)")
        return self.decoder(h_src, h_dst, rel)

    def save(self, path) -> None:
        from sparkgnn.models.serialization import save_model

        save_model(self, path)

    @classmethod
    def load(cls, path, *, allow_modules: Sequence[str] = ()) -> Model:
        """The model saved at `path` (weights_only loading, no pickled code). `allow_modules`:
        packages besides torch_geometric.nn.conv whose conv classes a generic layer may be rebuilt
        from (layers/generic.py; also SPARKGNN_ALLOW_CONV_MODULES)."""
        from sparkgnn.models.serialization import load_model

        return load_model(cls, path, allow_modules=allow_modules)

    def fingerprint(self) -> str:
        from sparkgnn.models.serialization import fingerprint

        return fingerprint(self)

    def describe(self) -> dict:
        return copy.deepcopy(self.spec)

    def extra_repr(self) -> str:
        return f"output={self.output!r}, in_dim={self.in_dim}, out_dim={self.out_dim}"
