"""Graph updates: a Parquet format for a day's changes to a graph, and applying them to a GraphData.

Real graphs change daily; refreshing precomputed embeddings incrementally needs to know exactly
what changed. Four jobs, one module each (their docs give the design decisions):

* format.py: the update table (UPDATE_SCHEMA, one `kind` per row), GraphUpdate with its Parquet
  read/write, and the problem reporting (UpdateProblem) that reading and validation share.
* validation.py: validate(), every reason an update cannot be applied to a graph, raised at once.
* applying.py: apply() -> Applied, the updated graph and the row / edge mappings a refresh needs.
* typed.py: TypedGraphUpdate (a GraphUpdate per node type and per relation, one folder each),
  apply_typed() / validate_typed() against a TypedGraphData.
(The modules are not named apply / validate so that the package's `apply` and `validate` are
always the functions, never shadowed submodules.)
"""

from sparkgnn.graph.updates.applying import Applied, apply
from sparkgnn.graph.updates.format import (
    EDGE_DELETE,
    EDGE_INSERT,
    FEATURE_UPDATE,
    KINDS,
    UPDATE_SCHEMA,
    VERTEX_DELETE,
    VERTEX_INSERT,
    GraphUpdate,
    UpdateProblem,
)
from sparkgnn.graph.updates.typed import TypedApplied, TypedGraphUpdate, apply_typed, validate_typed
from sparkgnn.graph.updates.validation import validate

__all__ = [
    "EDGE_DELETE",
    "EDGE_INSERT",
    "FEATURE_UPDATE",
    "KINDS",
    "UPDATE_SCHEMA",
    "VERTEX_DELETE",
    "VERTEX_INSERT",
    "Applied",
    "GraphUpdate",
    "TypedApplied",
    "TypedGraphUpdate",
    "UpdateProblem",
    "apply",
    "apply_typed",
    "validate",
    "validate_typed",
]
