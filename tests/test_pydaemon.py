"""sparkgnn.pydaemon: a local session's Python workers are forked from sparkgnn's daemon, with
torch and the task modules imported before the fork and their objects frozen out of the
collector's reach; SPARKGNN_PYDAEMON=off gives pyspark's own daemon back."""

import subprocess
import sys

from sparkgnn.engine import session as session_mod


def test_workers_fork_from_sparkgnns_daemon_with_the_task_modules_imported_and_frozen(spark):
    # nested, so that it is pickled by value (a test module does not import in a worker)
    def _worker_facts(batches):
        """Run in a Python worker: what its process held before the task imported anything."""
        import gc
        import os
        import sys as worker_sys

        import pyarrow as pa

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            parent = fh.read().replace(b"\0", b" ").decode()
        facts = {
            "parent": [parent],
            "pyspark": [worker_sys.modules["pyspark"].__file__],
            "torch": ["torch" in worker_sys.modules],
            "steps": ["sparkgnn.engine.steps" in worker_sys.modules],
            "frozen": [gc.get_freeze_count()],
        }
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict(facts)

    rows = (
        spark.range(2, numPartitions=2)
        .mapInArrow(_worker_facts, "parent string, pyspark string, torch boolean, steps boolean, frozen long")
        .collect()
    )
    assert rows and all("sparkgnn.pydaemon" in r.parent for r in rows), [r.parent for r in rows]
    assert all(r.torch and r.steps for r in rows)
    assert all(".zip" not in r.pyspark for r in rows), [r.pyspark for r in rows]  # the installed package's bytecode
    assert all(r.frozen > 10_000 for r in rows)  # torch's objects, at least


def test_local_conf_names_the_daemon_and_off_restores_pysparks(monkeypatch):
    monkeypatch.delenv(session_mod.PYDAEMON_ENV, raising=False)
    assert session_mod.local_conf()[session_mod.DAEMON_KEY] == "sparkgnn.pydaemon"
    monkeypatch.setenv(session_mod.PYDAEMON_ENV, "off")
    assert session_mod.DAEMON_KEY not in session_mod.local_conf()
    # a daemon the caller names is kept
    assert (
        session_mod.local_conf({session_mod.DAEMON_KEY: "pyspark.daemon"})[session_mod.DAEMON_KEY] == "pyspark.daemon"
    )
    assert session_mod.local_conf({"spark.x": "1"})["spark.x"] == "1"


def test_importing_the_daemon_module_imports_neither_pyspark_nor_torch():
    """Only `python -m sparkgnn.pydaemon` (main) imports the workers' modules and serves."""
    code = (
        "import gc, sys, sparkgnn.pydaemon; "
        "print(gc.get_freeze_count(), 'pyspark' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["0", "False", "False"]


def test_an_installed_pysparks_own_zip_goes_last_and_any_other_zip_keeps_its_place(tmp_path):
    from sparkgnn.pydaemon import prefer_installed_pyspark

    site = tmp_path / "site"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    own = str(lib / "pyspark.zip")
    py4j = str(lib / "py4j-0.10.9.9-src.zip")
    assert prefer_installed_pyspark([own, py4j, "/x", str(site)]) == [py4j, "/x", str(site), own]
    # the package's folder not on the path: the zip is what the workers import, left first
    assert prefer_installed_pyspark([own, "/x"]) == [own, "/x"]
    # a Spark distribution's zip (SPARK_HOME elsewhere): its version is the JVM's, kept first
    other = str(tmp_path / "spark-4.3.0" / "python" / "lib" / "pyspark.zip")
    assert prefer_installed_pyspark([other, str(site)]) == [other, str(site)]
