"""sparkgnn: GNN inference and serving for graphs that outgrow one machine.

Spark holds and moves the graph, PyTorch workers run the neural layers, a messenger pipes Arrow
micro-batches between them and a planner compiles model + task into an operator plan.
Heavy submodules (torch, pyspark) load lazily so `import sparkgnn` stays cheap.
"""

from importlib import import_module

from sparkgnn.errors import (
    GraphValidationError,
    ModelLoadError,
    PlanError,
    SparkGNNError,
    StalePEStore,
    UnsupportedModelError,
)

__version__ = "0.1.0"

_LAZY = {
    "Graph": "sparkgnn.graph",
    "Model": "sparkgnn.models",
    "infer": "sparkgnn.engine",
    "PEStore": "sparkgnn.pe",
    "precompute": "sparkgnn.engine",
    "refresh": "sparkgnn.engine.refresh",
    "JobResult": "sparkgnn.engine.result",
    "StoreResult": "sparkgnn.engine.result",
    "QueryEngine": "sparkgnn.serving.engine",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sparkgnn' has no attribute {name!r}")


__all__ = [
    "Graph",
    "Model",
    "infer",
    "PEStore",
    "precompute",
    "refresh",
    "JobResult",
    "StoreResult",
    "QueryEngine",
    "SparkGNNError",
    "GraphValidationError",
    "UnsupportedModelError",
    "ModelLoadError",
    "PlanError",
    "StalePEStore",
]
