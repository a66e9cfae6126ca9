"""The decoder contract: `decoder(h_src, h_dst) -> [N]` scores of N node pairs from their node outputs.

WHY a closed family: a decoder is saved with its model as JSON + weights (models/serialization.py:
no pickled code) and runs wherever pairs are scored (a Spark task's Arrow batch, a service), so
each kind is a small torch module rebuilt from its `config()`. The kinds are picked by name from a
saved spec (DECODERS, a Registry: an unknown kind is refused naming the known ones).

`in_dim` is the width of ONE node output the decoder reads (None: any width, as for a parameter-
free dot product); a model refuses a decoder whose width differs from its output's. `final` is an
optional monotone map of the score (`"sigmoid"`, as PyG's examples apply to turn a logit into a
probability): it never changes which candidates rank first, so top-k and the approximate index
ignore it and apply it to the kept scores. `inner_product` says whether the score (before `final`)
is an inner product of per-node vectors (`search_vectors` of each side), which is what a vector
index searches: dot and cosine decoders. `relational` kinds (relational.py: DistMult, TransE) also
read each pair's relation, `decoder(h_src, h_dst, rel)`; the others refuse one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sparkgnn.registry import Registry

DECODERS: Registry[type] = Registry("decoder kind", ValueError)
FINALS = ("sigmoid",)


class Decoder(torch.nn.Module):
    """Base of every decoder kind: `raw(h_src, h_dst)` is the score before `final`."""

    kind: str = ""
    inner_product: bool = False
    relational: bool = False

    def __init__(self, in_dim: int | None = None, final: str | None = None):
        super().__init__()
        if final is not None and final not in FINALS:
            raise ValueError(f"decoder final {final!r} is not supported (one of {FINALS} or none)")
        self.in_dim = None if in_dim is None else int(in_dim)
        self.final = final

    def config(self) -> dict:
        """JSON description; `build_decoder(config)` rebuilds the module (weights zero until a
        state_dict is loaded)."""
        return {"kind": self.kind, "in_dim": self.in_dim, "final": self.final}

    def raw(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        raise NotImplementedError

    def apply_final(self, score: Tensor) -> Tensor:
        """`final` applied to raw scores (identity when there is none)."""
        return torch.sigmoid(score) if self.final == "sigmoid" else score

    def search_vectors(self, h: Tensor) -> Tensor:
        """The vectors whose inner product is the raw score (inner-product decoders only)."""
        raise ValueError(f"a {self.kind} decoder is not an inner product; it has no search vectors")

    def project(self, h: Tensor) -> tuple[Tensor, Tensor] | None:
        """(source side, destination side) per-node projections of [N, F] node outputs such that
        `raw_projected(src_side[i], dst_side[j])` is the raw score of the pair (i, j), or None when
        this decoder has none. WHY: a pair's work that depends on one endpoint alone is done once
        per node instead of once per pair (an MLP on [h_s | h_d] whose first Linear splits into a
        source and a destination half): scoring 10M pairs or a top-k over every candidate then
        gathers and adds narrower rows instead of multiplying every pair's concatenation."""
        return None

    def raw_projected(self, src_side: Tensor, dst_side: Tensor) -> Tensor:
        """The raw scores of pairs given their endpoints' `project` rows (decoders with projections);
        the two broadcast against each other ([S, 1, H] and [1, C, H] score every pair: [S, C])."""
        raise ValueError(f"a {self.kind} decoder has no per-node projections")

    def check_width(self, width: int, where: str = "the node outputs") -> None:
        """Refuse (ValueError, one line) node outputs of a width this decoder cannot read."""
        if self.in_dim is not None and int(width) != self.in_dim:
            raise ValueError(
                f"the {self.kind} decoder reads node outputs of width {self.in_dim} but {where} have width {width}"
            )

    @torch.no_grad()
    def forward(self, h_src: Tensor, h_dst: Tensor, rel: Any = None) -> Tensor:
        """[N] scores of the pairs (h_src[i], h_dst[i]); both [N, F] float32. `rel` is for
        relational kinds only (refused here)."""
        if rel is not None:
            raise ValueError(f"the {self.kind} decoder takes no relation; only distmult and transe decoders do")
        h_src = torch.as_tensor(h_src, dtype=torch.float32)
        h_dst = torch.as_tensor(h_dst, dtype=torch.float32)
        if h_src.dim() != 2 or h_src.shape != h_dst.shape:
            raise ValueError(
                "decoder inputs must be two [N, F] tensors of one shape, got "
                f"{tuple(h_src.shape)} and {tuple(h_dst.shape)}"
            )
        self.check_width(int(h_src.shape[1]))
        return self.apply_final(self.raw(h_src, h_dst))


def build_decoder(config: dict) -> Decoder:
    """The decoder a `config()` describes (weights zero until a state_dict is loaded)."""
    if not isinstance(config, dict) or "kind" not in config:
        raise ValueError(f"a decoder spec must be a dict with a 'kind', got {config!r}")
    options = dict(config)
    cls = DECODERS.lookup(options.pop("kind"))
    decoder = cls(**options)
    decoder.float()
    for p in decoder.parameters():
        p.requires_grad_(False)
    return decoder.train(False)
