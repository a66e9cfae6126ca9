"""A spark-submit driver that runs sparkgnn's job scripts one after another in ONE application on a
multi-process cluster (tests/cluster_harness.py starts it once per test module that shares it).

Why: starting a `local-cluster[2,1,1024]` application (driver JVM, master, worker, two executor
JVMs, their Python workers importing torch) costs more CPU than the kill tests' small jobs
themselves. The jobs run as a user's would in a notebook on the cluster: each script's `main(argv)`
with the script's own arguments, in its own working directory, on the session this driver holds
(the scripts leave a session they did not start running). Executors killed by a test are
relaunched by the standalone master, as on a real cluster.

Protocol: `@@jobserver ready` once the session is up; then one JSON line per job,
`{"script", "args", "cwd"}`, on the named pipe given as the only argument (spark-submit does not
hand its own stdin to a Python driver), answered by the job's output lines and
`@@jobserver done <exit status>`. The server ends when the pipe's writer closes it."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import traceback

READY = "@@jobserver ready"
DONE = "@@jobserver done"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(script: str, cache: dict):
    """The job module spark_jobs/<script>, loaded once per server."""
    if script not in cache:
        path = os.path.join(REPO, "spark_jobs", script)
        spec = importlib.util.spec_from_file_location(f"jobserver_{os.path.splitext(script)[0]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cache[script] = module
    return cache[script]


def _run(module, args: list[str]) -> int:
    """The job's exit status: main's return value, SystemExit's code (argparse), or 1 for an error
    that escaped main (printed with its traceback, as a crashed job's driver would)."""
    from sparkgnn.logs import CLI_HANDLER, LOGGER

    logger = logging.getLogger(LOGGER)
    level = logger.level
    try:
        return int(module.main(args) or 0)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    except Exception:  # noqa: BLE001 - the test reads the traceback from the output
        traceback.print_exc(file=sys.stdout)
        return 1
    finally:
        # each job installs the CLI log handler; the next one must not print its lines twice
        for handler in [h for h in logger.handlers if h.get_name() == CLI_HANDLER]:
            logger.removeHandler(handler)
        logger.setLevel(level)
        sys.stdout.flush()


def main() -> int:
    sys.path.insert(0, os.path.join(REPO, "spark_jobs"))
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("sparkgnn-cluster-tests").getOrCreate()
    print(READY, flush=True)
    modules: dict = {}
    with open(sys.argv[1]) as jobs:  # blocks until the harness opens the pipe's other end
        for line in jobs:
            if not line.strip():
                continue
            job = json.loads(line)
            os.chdir(job["cwd"])
            status = _run(_load(job["script"], modules), list(job["args"]))
            print(f"{DONE} {status}", flush=True)
    (SparkSession.getActiveSession() or spark).stop()  # a job may have replaced the session: stop the live one
    return 0


if __name__ == "__main__":
    sys.exit(main())
