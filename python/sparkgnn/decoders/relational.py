"""Relation-aware decoders: one learned vector per relation, scored with each pair's relation.

    distmult: score = sum(h_src * rel[r] * h_dst)        (PyG's examples/rgcn_link_pred.py DistMultDecoder)
    transe:   score = -||h_src + rel[r] - h_dst||_p      (p = 1 or 2, as PyG's TransE)

`rel` is the [num_relations, in_dim] table (state_dict key "rel_emb", saved with the model's
weights); a pair's relation is an integer index into it, or a name when the decoder carries a
`relations` list (the names of the table's rows, in order). WHY a `relation` binding
(`bind(r)`): top-k ranks candidates for ONE relation at a time, and a decoder bound to it scores
`(h_src, h_dst)` like any other decoder, so the tiled top-k and its Spark payload run unchanged.
Neither kind is an inner product of per-node vectors shared by both sides, so neither takes the
approximate index.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sparkgnn.decoders.base import DECODERS, Decoder

RelationsLike = Tensor | np.ndarray | Sequence[int] | Sequence[str]


class RelationalDecoder(Decoder):
    """Base of the per-relation kinds: `raw(h_src, h_dst, rel)` with rel an [N] index tensor (or
    the bound relation when rel is None)."""

    relational = True

    def __init__(
        self,
        in_dim: int | None = None,
        final: str | None = None,
        num_relations: int = 0,
        relations: Sequence[str] | None = None,
        relation: int | None = None,
    ):
        if in_dim is None or int(in_dim) <= 0:
            raise ValueError(f"a {self.kind} decoder needs its node output width in_dim >= 1, got {in_dim!r}")
        if int(num_relations) <= 0:
            raise ValueError(f"a {self.kind} decoder needs num_relations >= 1, got {num_relations!r}")
        super().__init__(in_dim, final)
        self.num_relations = int(num_relations)
        self.relations = check_relation_names(relations, self.num_relations)
        self.rel_emb = torch.nn.Parameter(torch.zeros(self.num_relations, int(in_dim)), requires_grad=False)
        self.relation = None if relation is None else self._index_one(relation)

    def config(self) -> dict:
        return {
            **super().config(),
            "num_relations": self.num_relations,
            "relations": None if self.relations is None else list(self.relations),
            "relation": self.relation,
        }

    # -- relations ------------------------------------------------------------------------------
    def _index_one(self, relation: int | str) -> int:
        if isinstance(relation, str):
            if self.relations is None or relation not in self.relations:
                known = "the decoder has no relation names" if self.relations is None else f"known: {self.relations}"
                raise ValueError(f"unknown relation {relation!r} ({known})")
            return self.relations.index(relation)
        if isinstance(relation, bool) or not isinstance(relation, (int, np.integer)):
            raise ValueError(f"a relation is an integer index or a name, got {relation!r}")
        if not 0 <= int(relation) < self.num_relations:
            raise ValueError(f"relation {int(relation)} is out of range (the decoder has {self.num_relations})")
        return int(relation)

    def relation_index(self, rel: RelationsLike) -> Tensor:
        """[N] int64 indices of `rel`: integers in [0, num_relations), or names of `relations`;
        ValueError (one line) naming the first that is neither."""
        if isinstance(rel, Tensor):
            values = rel.detach().cpu().numpy()
        elif isinstance(rel, np.ndarray):
            values = rel
        else:
            values = np.asarray(rel if not isinstance(rel, str) else [rel], dtype=object)
        values = np.asarray(values).reshape(-1)
        if values.dtype.kind in "iu":
            index = values.astype(np.int64)
        else:  # names and/or boxed integers: each distinct value looked up once
            known: dict = {}
            index = np.asarray(
                [known[v] if v in known else known.setdefault(v, self._index_one(_as_int(v))) for v in values.tolist()],
                np.int64,
            )
        bad = (index < 0) | (index >= self.num_relations)
        if bad.any():
            raise ValueError(
                f"relation {int(index[bad][0])} is out of range (the decoder has {self.num_relations} relations)"
            )
        return torch.from_numpy(index)

    def bind(self, relation: int | str) -> RelationalDecoder:
        """A copy that scores every pair with `relation` (an index or a name): `decoder(h_src, h_dst)`."""
        bound = copy.deepcopy(self)
        bound.relation = self._index_one(relation)
        return bound

    def raw(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        """Raw scores with relation rel[i] per pair (None: the bound relation)."""
        raise NotImplementedError

    def _rows(self, rel: Tensor | None, n: int) -> Tensor:
        if rel is None:
            if self.relation is None:
                raise ValueError(f"the {self.kind} decoder scores a pair with its relation: give one per pair")
            return self.rel_emb[self.relation].expand(n, -1)
        if rel.shape != (n,):
            raise ValueError(f"the {self.kind} decoder needs one relation per pair: {n} pairs, {tuple(rel.shape)}")
        return self.rel_emb[rel]

    @torch.no_grad()
    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Any = None) -> Tensor:
        """[N] scores of the pairs (h_src[i], h_dst[i]) under relation rel[i] (None: the bound one)."""
        index = None if rel is None else self.relation_index(rel)
        h_src = torch.as_tensor(h_src, dtype=torch.float32)
        h_dst = torch.as_tensor(h_dst, dtype=torch.float32)
        if h_src.dim() != 2 or h_src.shape != h_dst.shape:
            raise ValueError(
                "decoder inputs must be two [N, F] tensors of one shape, got "
                f"{tuple(h_src.shape)} and {tuple(h_dst.shape)}"
            )
        self.check_width(int(h_src.shape[1]))
        return self.apply_final(self.raw(h_src, h_dst, index))


def _as_int(value) -> int | str:
    return int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value


def check_relation_names(relations: Sequence[str] | None, count: int) -> tuple[str, ...] | None:
    """`relations` as a tuple when they are `count` distinct strings (None stays None); ValueError otherwise."""
    if relations is None:
        return None
    names = tuple(relations) if not isinstance(relations, str) else (relations,)
    if len(names) != count or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ValueError(
            f"relations must be {count} distinct non-empty names (one per row of the relation table), got {names!r}"
        )
    return names


@DECODERS.register("distmult")
class DistMultDecoder(RelationalDecoder):
    kind = "distmult"

    def raw(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        return torch.sum(h_src * self._rows(rel, len(h_src)) * h_dst, dim=-1)


@DECODERS.register("transe")
class TransEDecoder(RelationalDecoder):
    kind = "transe"

    def __init__(
        self,
        in_dim: int | None = None,
        final: str | None = None,
        num_relations: int = 0,
        relations: Sequence[str] | None = None,
        relation: int | None = None,
        p: float = 2.0,
    ):
        if float(p) not in (1.0, 2.0):
            raise ValueError(f"a transe decoder's norm p must be 1 or 2, got {p!r}")
        super().__init__(in_dim, final, num_relations, relations, relation)
        self.p = float(p)

    def config(self) -> dict:
        return {**super().config(), "p": self.p}

    def raw(self, h_src: Tensor, h_dst: Tensor, rel: Tensor | None = None) -> Tensor:
        return -torch.linalg.vector_norm(h_src + self._rows(rel, len(h_src)) - h_dst, ord=self.p, dim=-1)
