"""A model's decoder as something a Spark task can rebuild: its JSON config and its weights as
numpy arrays (no pickled module), rebuilt once per Python worker process (cached by fingerprint)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import torch

from sparkgnn.decoders import Decoder, build_decoder

_BUILT: dict[str, Decoder] = {}


@dataclass(frozen=True)
class DecoderPayload:
    config: dict
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, decoder: Decoder) -> DecoderPayload:
        state = {k: v.detach().cpu().numpy().copy() for k, v in decoder.state_dict().items()}
        return cls(decoder.config(), state)

    @property
    def key(self) -> str:
        h = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode())
        for name in sorted(self.weights):
            h.update(name.encode() + self.weights[name].tobytes())
        return h.hexdigest()

    def build(self) -> Decoder:
        """The decoder (built once per process and key)."""
        key = self.key
        if key not in _BUILT:
            decoder = build_decoder(self.config)
            decoder.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in self.weights.items()}, strict=True)
            _BUILT[key] = decoder
        return _BUILT[key]


def model_decoder(model) -> Decoder:
    """The model's decoder, or ValueError (one line) when it was converted without one."""
    if getattr(model, "decoder", None) is None:
        raise ValueError(
            "the model has no decoder; convert it with Model.from_pyg(encoder, decoder=module) to score pairs"
        )
    return model.decoder
