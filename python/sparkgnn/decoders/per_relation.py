"""Per-relation decoder container: one decoder module, with its own weights, per edge type.

    score of a pair of relation r = members[r](h_src, h_dst)

PyG's heterogeneous link-prediction models commonly train one decoder module per edge type
(`torch.nn.ModuleDict({edge_key: decoder})`, or a dict {edge_type: decoder}); each member is any
kind that scores a pair from its two node outputs alone (dot, cosine, mlp), rebuilt from its own
config and saved with its own weights (state_dict keys `members.<key>.…`). Members are keyed by
relation: an edge type key `src__rel__dst` or a relation name; a HeteroModel's `set_decoder`
resolves them against its edge types and stores keys.

WHY one container and not a dict on the model: a model keeps ONE decoder (its spec, weights,
fingerprint, Spark payload), and a typed job asks it for the decoder of one relation
(linkpred/typed.py `relation_decoder` -> `member(r)`), which scores like any other decoder, so
score_edges, top-k, the approximate index and evaluation run a member unchanged. WHY members are
not relational (distmult, transe): those already hold one row per relation and cover every edge
type as the model's decoder on their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from sparkgnn.decoders.base import DECODERS, Decoder, build_decoder
from sparkgnn.layers.hetero import KEY_SEPARATOR

MemberKey = str | tuple[str, str, str]


def member_key(key: Any) -> str:
    """`key` as a member key: a non-empty string without '.' (module paths), or an edge type
    (src, rel, dst) joined into `src__rel__dst`; ValueError (one line) otherwise."""
    if isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) and k for k in key):
        key = KEY_SEPARATOR.join(key)
    if not isinstance(key, str) or not key or "." in key:
        raise ValueError(
            f"a per-relation decoder's member key must be an edge type (src, rel, dst), its key "
            f"'src{KEY_SEPARATOR}rel{KEY_SEPARATOR}dst' or a relation name (no '.'), got {key!r}"
        )
    return key


@DECODERS.register("per_relation")
class PerRelationDecoder(Decoder):
    """{relation: decoder} (module doc). `members`: decoders or their configs (as saved)."""

    kind = "per_relation"

    def __init__(
        self,
        in_dim: int | None = None,
        final: str | None = None,
        members: Mapping[Any, Decoder | dict] | None = None,
    ):
        if in_dim is not None or final is not None:
            raise ValueError("a per_relation decoder takes no in_dim or final of its own; its members carry theirs")
        if not isinstance(members, Mapping) or not members:
            raise ValueError("a per_relation decoder needs members: a non-empty {relation: decoder}")
        super().__init__(None, None)
        built: dict[str, Decoder] = {}
        for key, member in members.items():
            name = member_key(key)
            if name in built:
                raise ValueError(f"the per_relation decoder names relation {name!r} twice")
            decoder = build_decoder(member) if isinstance(member, dict) else member
            if not isinstance(decoder, Decoder):
                raise ValueError(
                    f"member {name!r} of a per_relation decoder is a {type(decoder).__name__}, not a decoder"
                )
            if isinstance(decoder, PerRelationDecoder) or decoder.relational:
                raise ValueError(
                    f"member {name!r} of a per_relation decoder is a {decoder.kind} decoder; members score one "
                    "relation each (dot, cosine, mlp): attach a per-relation table (distmult, transe) on its own"
                )
            built[name] = decoder
        self.members = torch.nn.ModuleDict(built)
        self.inner_product = all(m.inner_product for m in built.values())

    @property
    def relations(self) -> tuple[str, ...]:
        """The members' keys, in order."""
        return tuple(self.members.keys())

    def _members(self) -> dict[str, Decoder]:
        return {k: cast(Decoder, m) for k, m in self.members.items()}

    def config(self) -> dict:
        return {**super().config(), "members": {k: m.config() for k, m in self._members().items()}}

    def member(self, relation: MemberKey) -> Decoder:
        """The decoder of `relation` (a member key or an edge type); ValueError (one line) naming
        it and the relations the container has when it has no member for it."""
        key = member_key(relation)
        if key not in self.members:
            raise ValueError(
                f"the per_relation decoder has no member for relation {key} (it has {', '.join(self.relations)})"
            )
        return cast(Decoder, self.members[key])

    def check_width(self, width: int, where: str = "the node outputs") -> None:
        """Refuse (ValueError, one line) a width some member cannot read."""
        for key, m in self._members().items():
            try:
                m.check_width(width, where)
            except ValueError as e:
                raise ValueError(f"relation {key}: {e}") from None

    def search_vectors(self, h: Tensor) -> Tensor:
        raise ValueError("a per_relation decoder's search vectors are its members'; take the relation's member first")

    def raw(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        raise ValueError("a per_relation decoder scores a pair with its relation's member: give the relation")

    @torch.no_grad()
    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Any = None) -> Tensor:
        """[N] scores of the pairs (h_src[i], h_dst[i]) by the member of relation `rel`: one
        relation for every pair (a key or an edge type) or N member keys, one per pair."""
        if rel is None:
            raise ValueError("a per_relation decoder scores a pair with its relation's member: give the relation")
        if isinstance(rel, (str, tuple)):
            return self.member(rel)(h_src, h_dst)
        names = np.asarray(list(rel) if not isinstance(rel, np.ndarray) else rel, dtype=object).reshape(-1)
        h_src = torch.as_tensor(h_src, dtype=torch.float32)
        h_dst = torch.as_tensor(h_dst, dtype=torch.float32)
        if len(names) != len(h_src):
            raise ValueError(f"the per_relation decoder needs one relation per pair: {len(h_src)} pairs, {len(names)}")
        out = torch.empty(len(h_src), dtype=torch.float32)
        for name in dict.fromkeys(names.tolist()):
            rows = torch.from_numpy(np.flatnonzero(names == name))
            out[rows] = self.member(name)(h_src[rows], h_dst[rows])
        return out
