"""Every error sparkgnn raises on purpose derives from SparkGNNError, so callers can tell a
clear, named refusal (bad input, stale store, unsupported layer) from a bug deep in a library.

The two standalone leaves, messenger/ and planner/, import nothing else of sparkgnn and so have
bases of their own (MessengerError, PlanError). USER_ERRORS lists all three: catch it (or test
isinstance against it) where any deliberate refusal must be caught, e.g. the command lines'
one-line errors (sparkgnn.cliargs). PlanError is re-exported here, as it always was.
"""

from sparkgnn.messenger.errors import MessengerError
from sparkgnn.planner.errors import PlanError


class SparkGNNError(Exception):
    """Base class of all deliberate sparkgnn errors."""


class GraphValidationError(SparkGNNError, ValueError):
    """The graph's vertices or edges are malformed (duplicates, dangling ids, bad widths, NaN).
    `problems` (when raised by the validators): the graph.problems.Problem list behind the message."""

    problems: list


class GraphUpdateError(SparkGNNError, ValueError):
    """A graph update (graph.updates) cannot be read, or cannot be applied to its graph: unknown ids,
    duplicates, wrong widths, deletes of edges the graph does not hold. Raised before anything is
    applied, listing every problem at once. `problems`: the updates.UpdateProblem list behind it."""

    problems: list


class UnsupportedModelError(SparkGNNError, ValueError):
    """A model uses a layer or option sparkgnn cannot run exactly."""


class ModelLoadError(SparkGNNError, ValueError):
    """A saved model is missing, corrupt or does not match its spec."""


class StalePEStore(SparkGNNError):
    """A PE store was computed for another model or graph than the one it is asked to serve."""


class OutputError(SparkGNNError, ValueError):
    """An output location cannot be written safely: it holds data the caller did not ask to
    replace, it is (or overlaps) one of the job's inputs, or it is not writable."""


class DamagedPEStore(StalePEStore):
    """A committed PE store layer no longer matches what its manifest recorded (a file missing,
    truncated, changed or added): the store cannot be trusted until the layer is recomputed."""


class PEStoreConflict(SparkGNNError):
    """Two writers on one PE store: another writer took the store's lease, or committed to its
    manifest, after this one started. The displaced writer stops before committing anything."""


class LayerFailed(SparkGNNError, RuntimeError):
    """A layer step's Spark job failed (engine.failures): the message names the step, what was
    lost, and whether a rerun resumes. `run_path`: where its committed steps are kept, or None."""

    def __init__(self, message: str, label: str = "", lost: str | None = None, run_path: str | None = None):
        super().__init__(message)
        self.label = label
        self.lost = lost
        self.run_path = run_path


# Every base of a deliberate refusal: sparkgnn's own, the messenger's and the planner's.
USER_ERRORS: tuple[type[Exception], ...] = (SparkGNNError, MessengerError, PlanError)

__all__ = [
    "SparkGNNError",
    "GraphValidationError",
    "GraphUpdateError",
    "UnsupportedModelError",
    "ModelLoadError",
    "PlanError",
    "StalePEStore",
    "OutputError",
    "DamagedPEStore",
    "PEStoreConflict",
    "LayerFailed",
    "MessengerError",
    "USER_ERRORS",
]
