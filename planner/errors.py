"""The planner's own error base. WHY not sparkgnn.errors.SparkGNNError: the planner is a leaf
(stdlib + numpy) that imports nothing else of sparkgnn, so it can run on a driver, in a notebook
or in the bench alone. sparkgnn.errors re-exports PlanError and lists it in USER_ERRORS, so
`from sparkgnn.errors import PlanError` and the command lines' one-line refusals keep working."""


class PlanError(ValueError):
    """The planner cannot produce a plan for this model/graph/task (e.g. a forced strategy that
    does not apply, a malformed input naming the key at fault)."""
