"""The Python daemon of sparkgnn's local sessions: pyspark's own daemon (`pyspark.daemon`, which
forks a Python worker per task slot), started with the modules sparkgnn's tasks run already
imported, and their objects frozen out of the garbage collector's reach.

Why, measured in a cold 8M-edge batch job (py-spy over every process, docs/ARCHITECTURE.md):
- every worker imported torch, pyarrow and sparkgnn's task modules itself (about 2.5-3 s of CPU
  each, two at once on a 2-core box, in the first Python job of every job);
- a reused worker runs `gc.collect()` after each task (pyspark.daemon), which walked every object
  those imports made: 2.3 s of the workers' 27 s of CPU in that job.
Imported once here, a forked worker starts with them mapped (copy-on-write); `gc.freeze()` then
moves them to the permanent generation, so a worker's collections walk only what its tasks made.

What is imported is what fork handles: torch and numpy start their thread pools on first use,
not at import, and pyarrow's allocator (jemalloc) re-initialises its background thread in the
child; no Spark task runs here. Nothing from the network or a file is read: the daemon then runs
pyspark's manager unchanged (its socket, its secret, its worker module).

Sessions select it with `spark.python.daemon.module` (engine.session.LOCAL_CONF and the test
harness's clusters); `SPARKGNN_PYDAEMON=off` keeps pyspark's plain daemon (a worker Python without
sparkgnn fails the first Python task either way, importing the task's module).
"""

from __future__ import annotations

import gc
import os
import sys


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """`path` (sys.path) with the pyspark.zip of an installed pyspark package moved to the end.

    WHY: Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on its Python workers' PYTHONPATH,
    and a zip is imported from source, compiled again in every process (pyspark.worker: ~1 s,
    against 0.2 s from the installed package's cached bytecode). Where SPARK_HOME is a pip-installed
    pyspark (local sessions, `pip install pyspark` clusters), that zip ships inside the installed
    package itself (`<site>/pyspark/python/lib/pyspark.zip`, the same wheel and version), so the
    package is imported instead. A zip anywhere else (a Spark distribution's SPARK_HOME, whose
    version the installed package need not match) keeps its place."""
    entries = {os.path.realpath(entry) for entry in path if entry}
    moved = []
    for entry in path:
        if os.path.basename(entry) != "pyspark.zip":
            continue
        lib = os.path.dirname(os.path.realpath(entry))
        package = os.path.dirname(os.path.dirname(lib))  # <site>/pyspark (from <site>/pyspark/python/lib)
        site = os.path.dirname(package)
        if (
            os.path.basename(package) == "pyspark"
            and lib == os.path.join(package, "python", "lib")
            and os.path.isfile(os.path.join(package, "__init__.py"))
            and site in entries
        ):
            moved.append(entry)
    return [entry for entry in path if entry not in moved] + moved


def main() -> None:
    """Import what the workers run, freeze it, then serve as pyspark's daemon (module doc). The
    imports are here, not at the module's top: importing sparkgnn's modules never imports
    pyspark or torch (docs/ARCHITECTURE.md)."""
    sys.path[:] = prefer_installed_pyspark(sys.path)
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    import pyspark.worker  # noqa: F401
    import torch  # noqa: F401
    from pyspark import daemon

    import sparkgnn.engine.exchange  # noqa: F401
    import sparkgnn.engine.prepare_tasks  # noqa: F401
    import sparkgnn.engine.steps  # noqa: F401

    gc.collect()
    gc.freeze()
    daemon.manager()


if __name__ == "__main__":
    main()
