"""What every sparkgnn command line shares: typed argument parsers and one way to fail.

WHY: a user mistake (a bad number, a stale store, an output that already exists) must read as ONE
line on stderr naming what is wrong, with exit code 2 (argparse's own code for usage errors), never
as an uncaught traceback from int(), pyarrow or Spark. So numbers are parsed by argparse types
(the error names the flag), and `run_cli` turns sparkgnn's deliberate errors (USER_ERRORS: its
own, the messenger's and the planner's), and the OS errors that are the user's to fix (a read-only
or full disk, a missing file), into that line.
Bugs (anything else) keep their traceback: hiding them would make them harder to report.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

from sparkgnn.errors import USER_ERRORS

USAGE_EXIT = 2
DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")  # where torch work may be asked to run


def device_name(text: str) -> str:
    """argparse type: cpu, cuda or cuda:i (checked without importing torch: whether this process
    sees the device is the command's question, asked where the work runs)."""
    if not DEVICE_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:i, got {text!r}")
    return text


def require_inputs(parser: argparse.ArgumentParser, inputs: dict) -> None:
    """Refuse (parser.error) an input flag whose path does not exist: {flag: path or None}. Local
    paths and the URIs pyarrow.fs reaches (s3://, s3a:// with AWS_* set, hdfs://) are checked; a
    URI this process cannot reach is left to Spark's Hadoop filesystem, which reads it on the
    cluster (files.reachable)."""
    from sparkgnn import files

    for flag, path in inputs.items():
        if path is None:
            continue
        if (files.is_local(path) or files.reachable(path)) and not files.exists(path):
            parser.error(f"{flag} {path!r} does not exist")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _bounded_int(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _bounded_int(text, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _bounded_int(text: str, lowest: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"must be >= {lowest}, got {value}")
    return value


def int_list(lowest: int = 1) -> Callable[[str], list[int]]:
    """argparse type: comma separated integers, each >= `lowest`, at least one (e.g. fanouts 25,10)."""

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in str(text).split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"needs at least one integer, got {text!r}")
        values = []
        for part in parts:
            try:
                values.append(_bounded_int(part, lowest))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{text!r}: {part!r} {exc}") from None
        return values

    parse.__name__ = "integer list"  # argparse names the type in its message
    return parse


# Phrases of the OS errors a JVM (Spark writing Parquet) reports inside its own exception text:
# the same user problems as the OSErrors below, reached through Py4J instead of Python.
_JVM_IO_PHRASES = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded")


def _jvm_io_message(exc: BaseException) -> str | None:
    """The line naming a disk problem inside a Spark/Py4J error, or None. Matched by class name so
    this module needs no pyspark/py4j import."""
    if type(exc).__name__ not in ("Py4JJavaError", "CapturedException") and not any(
        c.__name__ in ("PySparkException", "CapturedException") for c in type(exc).__mro__
    ):
        return None
    for line in str(exc).splitlines():
        if any(phrase in line for phrase in _JVM_IO_PHRASES):
            return line.strip()
    return None


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message for an error that is the user's to fix, or None for a bug."""
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    jvm = _jvm_io_message(exc)
    if jvm:
        return f"Spark could not write: {jvm}"
    if isinstance(exc, (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return f"{exc.strerror or exc}: {exc.filename}" if getattr(exc, "filename", None) else str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:  # disk full, read-only file system, ...
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or exc}{where}"
    return None


def line_buffered_output() -> None:
    """Flush stdout and stderr at every line, even into a pipe. Why: under spark-submit or a
    cluster manager stdout is a pipe, which Python block-buffers, so a job's progress lines
    ("layer 1/2: ...") arrived all at once when the job ended instead of as it ran."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # absent when replaced (e.g. captured)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def run_cli(prog: str, main: Callable[[], int | None]) -> int:
    """Run a command's body with line-buffered output; a user error prints `prog: error: message`
    and returns 2."""
    line_buffered_output()
    try:
        return int(main() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - classified below, re-raised when it is a bug
        message = user_error_message(exc)
        if message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return USAGE_EXIT
