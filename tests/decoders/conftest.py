"""Decoder tests: torch only (PyG decoders traced and compared on random node outputs)."""

from torch_fixtures import _one_torch_thread  # noqa: F401
