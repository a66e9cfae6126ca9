"""Models served by sparkgnn: PyG models converted into chains of merge-aware layers."""

from sparkgnn.models.hetero import HeteroModel
from sparkgnn.models.model import Model

__all__ = ["HeteroModel", "Model"]
