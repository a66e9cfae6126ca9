"""How sparkgnn reports progress: the standard `logging` module, one logger per module under `sparkgnn`.

Every module logs under its own name (`logging.getLogger(__name__)`): sparkgnn.engine.* (batch
inference, precompute, refresh on Spark), sparkgnn.pe.* (the PE store and its local precompute
and refresh), sparkgnn.streaming.*, sparkgnn.serving.*, sparkgnn.messenger.* and
sparkgnn.planner.* (the messenger and the planner are installed as parts of sparkgnn), so one
setting on `sparkgnn` or on a package quietens or routes them, e.g.
`logging.getLogger("sparkgnn.engine").setLevel(logging.WARNING)`. Progress lines are INFO,
problems the run works around (an unreadable calibration file, a damaged PE store layer, a
dead-lettered request file, a lost broker) are WARNING; errors are raised, not logged.

Library code only logs. Without a handler nothing is printed at INFO (Python's last-resort
handler prints WARNING and above to stderr); a notebook or a Spark driver configures `logging`
as it likes. Every command line (spark_jobs/*, sparkgnn-serve, sparkgnn-worker, sparkgnn-broker,
python -m sparkgnn.datasets, ...) calls install_cli_handler before its work, which prints each
line as it is, as the jobs always have. Spark's own (log4j) log level is not touched here.

The handler lives in the messenger (sparkgnn.messenger.cli), which may import nothing else of
sparkgnn and whose command lines need it too.
"""

from __future__ import annotations

from sparkgnn.messenger.cli import CLI_HANDLER, LOGGER, install_cli_handler

__all__ = ["CLI_HANDLER", "LOGGER", "install_cli_handler"]
