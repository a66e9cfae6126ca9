"""What the messenger's command lines share: one-line argument errors and one way to fail.

WHY its own module and not sparkgnn.cliargs: the messenger imports zmq + pyarrow only (nothing
else of sparkgnn), so the broker can run where the rest of sparkgnn cannot. The contract is the
same as cliargs': a user mistake (a taken port, a malformed endpoint, a bad number, no broker at
the address) reads as ONE line `prog: error: message` on stderr with exit code 2, never as a
traceback from libzmq or argparse's two-line usage dump. Bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sparkgnn.messenger.errors import MessengerError

USAGE_EXIT = 2


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
