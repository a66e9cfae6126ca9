"""Build the sparkgnn JVM jar offline, from the same sources build.sbt compiles.

Why not sbt: sbt (and the Maven repositories it resolves from) cannot be reached from the machines
this project is built on, but pyspark's own jars hold everything the compile needs: scala-compiler,
scala-library and scala-reflect 2.13 (the Scala pyspark runs) and Spark's jars for the classpath
("provided", as build.sbt declares them). So `make jar` runs scalac from those jars and packs the
classes with zipfile. A stamp (the jar's `.sha256` sibling: the sources' contents, the pyspark
version and this script) skips the build when nothing changed; the jar and its stamp are written
under temporary names and renamed, so an interrupted build leaves no half jar behind.

    python jvm/build.py [--out python/sparkgnn/jars/sparkgnn-jvm_2.13.jar] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "jvm" / "src" / "main" / "scala"
DEFAULT_JAR = ROOT / "python" / "sparkgnn" / "jars" / "sparkgnn-jvm_2.13.jar"
# Fixed entry times make the jar's bytes a function of its classes (scalac's output is deterministic).
ZIP_TIME = (2026, 1, 1, 0, 0, 0)


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def scala_sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.scala"))


def source_key(sources: list[Path], jars: Path) -> str:
    """What the jar is built from: every source (path and bytes), this script, pyspark's version."""
    import pyspark

    digest = hashlib.sha256()
    for path in [*sources, Path(__file__).resolve()]:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    digest.update(pyspark.__version__.encode())
    digest.update(",".join(sorted(p.name for p in jars.glob("scala-*.jar"))).encode())
    return digest.hexdigest()


def _jar(jars: Path, prefix: str) -> Path:
    found = sorted(jars.glob(f"{prefix}-2.13*.jar"))
    if not found:
        raise SystemExit(f"jvm/build.py: pyspark's jars ({jars}) hold no {prefix}-2.13*.jar to compile with")
    return found[-1]


def compile_sources(sources: list[Path], jars: Path, classes: Path) -> None:
    compiler = [_jar(jars, name) for name in ("scala-compiler", "scala-library", "scala-reflect")]
    classpath = os.pathsep.join(str(p) for p in sorted(jars.glob("*.jar")))
    command = [
        "java",
        "-Xss16m",
        "-cp",
        os.pathsep.join(str(p) for p in compiler),
        "scala.tools.nsc.Main",
        "-deprecation",
        "-feature",
        "-release",
        "17",
        "-classpath",
        classpath,
        "-d",
        str(classes),
        *(str(s) for s in sources),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"jvm/build.py: scalac failed (exit {result.returncode})")
    if result.stderr.strip():  # warnings
        sys.stderr.write(result.stderr)


def pack(classes: Path, jar: Path, key: str) -> None:
    manifest = (
        "Manifest-Version: 1.0\r\n"
        "Implementation-Title: sparkgnn-jvm\r\n"
        f"Implementation-Version: {key[:16]}\r\n"
        "Created-By: jvm/build.py\r\n\r\n"
    )
    temporary = jar.with_name(f".{jar.name}.tmp-{os.getpid()}")
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("META-INF/MANIFEST.MF", ZIP_TIME), manifest)
        for path in sorted(classes.rglob("*.class")):
            info = zipfile.ZipInfo(str(path.relative_to(classes)), ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    os.replace(temporary, jar)


def build(jar: Path, force: bool = False) -> bool:
    """Build `jar` unless its stamp says it is current; returns whether it was built."""
    sources = scala_sources()
    if not sources:
        raise SystemExit(f"jvm/build.py: no Scala sources under {SOURCES}")
    jars = pyspark_jars()
    key = source_key(sources, jars)
    stamp = jar.with_name(jar.name + ".sha256")
    if not force and jar.exists() and stamp.exists() and stamp.read_text().strip() == key:
        print(f"jvm/build.py: {jar.relative_to(ROOT)} is up to date")
        return False
    jar.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sparkgnn-jvm-") as classes:
        compile_sources(sources, jars, Path(classes))
        pack(Path(classes), jar, key)
    temporary = stamp.with_name(f".{stamp.name}.tmp-{os.getpid()}")
    temporary.write_text(key + "\n")
    os.replace(temporary, stamp)
    print(f"jvm/build.py: built {jar.relative_to(ROOT)} from {len(sources)} sources in {time.perf_counter() - started:.1f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_JAR, help="the jar to write")
    parser.add_argument("--force", action="store_true", help="build even when the stamp says the jar is current")
    args = parser.parse_args(argv)
    build(args.out.resolve(), args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
