"""Link-prediction decoders: score node pairs from their node outputs (base.py states the contract).

Kinds: dot, cosine, mlp (concat / hadamard / difference). `sparkgnn.models.pyg_decoders` converts a PyG
decoder module by tracing it; `build_decoder` rebuilds one from its saved config.
"""

from sparkgnn.decoders.base import DECODERS, Decoder, build_decoder
from sparkgnn.decoders.cosine import CosineDecoder
from sparkgnn.decoders.dot import DotDecoder
from sparkgnn.decoders.mlp import MLPDecoder

__all__ = ["DECODERS", "CosineDecoder", "Decoder", "DotDecoder", "MLPDecoder", "build_decoder"]
