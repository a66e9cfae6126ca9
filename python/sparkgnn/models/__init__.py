"""Models served by sparkgnn: PyG models converted into chains of merge-aware layers."""

from sparkgnn.models.model import Model

__all__ = ["Model"]
