"""Write the JVM class-data archive of Spark's classes (sparkgnn.engine.cds says why and how it is used).

A child Python starts a local Spark session whose driver JVM runs with
`-XX:ArchiveClassesAtExit=<temporary>`, runs a small workload that loads what sparkgnn's jobs load
(DataFrames from Arrow, a Python UDF through mapInArrow, a shuffle and an aggregate, a broadcast
join, a Parquet write and read), stops the session and waits for the JVM to exit, which is when
the JVM writes the archive; it is then renamed into place. A stamp (the archive's `.sha256`
sibling: `java -version`, the pyspark version, Spark's jar names and this script) skips the build
when nothing changed.

WHY failure is not an error: the archive only shortens JVM starts. A JDK that cannot write one
(older than 13, or built without CDS) leaves the package without it, and every JVM starts as
before; `make jar` says so in one line and goes on.

    python jvm/cds.py [--out python/sparkgnn/jars/spark-classes.jsa] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
from sparkgnn.engine.cds import ARCHIVE_ENV, QUIET, SUBMIT_OPTS, default_archive  # noqa: E402

#: The longest the workload and the JVM's dump may take together.
TIMEOUT_S = 300

WORKLOAD = r"""
import os, sys
import pyarrow as pa
from sparkgnn.engine.session import local_session

spark = local_session("sparkgnn-cds", cores=2, extra_conf={"spark.driver.extraJavaOptions": sys.argv[1]})
driver = spark.sparkContext._gateway.proc  # spark-submit, exec'd into the driver JVM
frame = spark.createDataFrame(pa.table({"id": list(range(2000)), "x": [float(i) for i in range(2000)]}).to_pandas())

def double(batches):
    for batch in batches:
        yield pa.RecordBatch.from_arrays([batch.column("id"), pa.compute.multiply(batch.column("x"), 2.0)], ["id", "x"])

from pyspark.sql import functions as F
doubled = frame.repartition(4, "id").mapInArrow(double, frame.schema)
joined = doubled.join(F.broadcast(frame.withColumnRenamed("x", "y")), "id").groupBy((F.col("id") % 7).alias("k"))
path = os.path.join(sys.argv[2], "rows")
joined.agg(F.sum("x").alias("x"), F.max("y").alias("y")).write.parquet(path)
assert spark.read.parquet(path).count() == 7
spark.stop()
driver.stdin.close()  # the gateway JVM exits at the end of its standard input, writing the archive
driver.wait(timeout=120)
"""


def java_version() -> str:
    result = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60)
    return result.stderr + result.stdout


def archive_key() -> str:
    """What the archive is written from: the JDK, pyspark's version and jars, this script."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    digest = hashlib.sha256()
    digest.update(java_version().encode())
    digest.update(pyspark.__version__.encode())
    digest.update(",".join(sorted(p.name for p in jars.glob("*.jar"))).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def build(archive: Path, force: bool = False) -> bool:
    """Write `archive` unless its stamp says it is current; returns whether it was written."""
    key = archive_key()
    stamp = archive.with_name(archive.name + ".sha256")
    if not force and archive.exists() and stamp.exists() and stamp.read_text().strip() == key:
        print(f"jvm/cds.py: {archive.name} is up to date")
        return False
    archive.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    temporary = archive.with_name(f".{archive.name}.tmp-{os.getpid()}")
    # C1 and the serial collector: the archive holds classes, not compiled code, and is written sooner
    options = f"-XX:ArchiveClassesAtExit={temporary} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC {QUIET}"
    env = {**os.environ, ARCHIVE_ENV: "off"}  # the dump's JVM maps no older archive
    env.pop(SUBMIT_OPTS, None)
    try:
        with tempfile.TemporaryDirectory(prefix="sparkgnn-cds-") as scratch:
            result = subprocess.run(
                [sys.executable, "-c", WORKLOAD, options, scratch],
                capture_output=True, text=True, env=env, timeout=TIMEOUT_S,
            )  # fmt: skip
        if result.returncode != 0 or not temporary.is_file() or temporary.stat().st_size == 0:
            tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["no output"]
            print(f"jvm/cds.py: no class-data archive written (JVMs start without it): {tail[0]}")
            return False
        os.replace(temporary, archive)
    except subprocess.TimeoutExpired:
        print(f"jvm/cds.py: no class-data archive written (JVMs start without it): the workload ran over {TIMEOUT_S} s")
        return False
    finally:
        temporary.unlink(missing_ok=True)
    written = stamp.with_name(f".{stamp.name}.tmp-{os.getpid()}")
    written.write_text(key + "\n")
    os.replace(written, stamp)
    size = archive.stat().st_size / 2**20
    print(f"jvm/cds.py: wrote {archive.name} ({size:.0f} MiB) in {time.perf_counter() - started:.1f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_archive(), help="the archive to write")
    parser.add_argument("--force", action="store_true", help="write it even when the stamp says it is current")
    args = parser.parse_args(argv)
    build(args.out.resolve(), args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
