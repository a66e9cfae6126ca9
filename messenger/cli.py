"""What the messenger's command lines share: one-line argument errors and one way to fail.

WHY its own module and not sparkgnn.cliargs: the messenger imports zmq + pyarrow only (nothing
else of sparkgnn), so the broker can run where the rest of sparkgnn cannot. The contract is the
same as cliargs': a user mistake (a taken port, a malformed endpoint, a bad number, no broker at
the address) reads as ONE line `prog: error: message` on stderr with exit code 2, never as a
traceback from libzmq or argparse's two-line usage dump. Bugs keep their traceback.

It also holds the one log handler every sparkgnn command line installs (install_cli_handler;
sparkgnn.logs documents the loggers): the messenger's own command lines need it, and the messenger
may not import the rest of sparkgnn.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from sparkgnn.messenger.errors import MessengerError

USAGE_EXIT = 2
#: The logger every sparkgnn module logs under (sparkgnn.engine.api, sparkgnn.messenger.broker, ...).
LOGGER = "sparkgnn"
#: The name of the handler install_cli_handler adds: how a second call finds it.
CLI_HANDLER = "sparkgnn-cli"
STREAMS = ("stdout", "stderr")


class _CurrentStream(logging.StreamHandler):
    """A StreamHandler that writes to whatever sys.stdout / sys.stderr is when a line is logged,
    not the stream of the moment it was made: a replaced stream (pytest's capture, a notebook's
    redirect) gets the lines, and a closed one is never written to."""

    def __init__(self, stream: str):
        self._stream_name = stream
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, _value) -> None:
        """StreamHandler sets a stream on creation; this handler always looks it up."""


def install_cli_handler(level: int = logging.INFO, *, stream: str = "stdout", prefix: str = "") -> logging.Handler:
    """Print the `sparkgnn` loggers' lines at `level` and above to sys.stdout or sys.stderr
    (`stream`), each as `prefix` + the message, flushed at once: what a command line calls before
    its work. Idempotent: the handler is added once per process; a later call only sets the level
    (the first call's stream and prefix stay). Library code never calls it: without a handler,
    progress lines (INFO) go nowhere and a notebook or a Spark driver's logging config decides."""
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {', '.join(STREAMS)}, got {stream!r}")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    for handler in logger.handlers:
        if handler.get_name() == CLI_HANDLER:
            return handler
    handler = _CurrentStream(stream)
    handler.set_name(CLI_HANDLER)
    handler.setFormatter(logging.Formatter(prefix.replace("%", "%%") + "%(message)s"))
    logger.addHandler(handler)
    return handler


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line naming the flag (plus where help is)."""

    def error(self, message: str):
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(text: str, kind: type, lowest, inclusive: bool):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    finite = kind is int or (value == value and abs(value) != float("inf"))
    if not finite or value < lowest or (value == lowest and not inclusive):
        raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {lowest:g}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (intervals)."""
    return _number(text, float, 0, inclusive=False)


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (timeouts where 0 means 'no limit')."""
    return _number(text, float, 0, inclusive=True)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (counts, byte limits)."""
    return _number(text, int, 1, inclusive=True)


def user_error_message(exc: BaseException) -> str | None:
    """The one-line message for an error that is the user's to fix, or None for a bug."""
    if isinstance(exc, MessengerError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or exc}{where}"
    return None


def run(prog: str, body: Callable[[], int | None]) -> int:
    """Run a command's body; a user error prints `prog: error: message` and returns 2."""
    try:
        return int(body() or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - classified below, re-raised when it is a bug
        message = user_error_message(exc)
        if message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
        return USAGE_EXIT
