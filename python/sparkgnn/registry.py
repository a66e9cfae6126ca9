"""`Registry`: the one way sparkgnn chooses an implementation by name.

WHY: convs, aggregators, serving modes, policies, groupings, datasets, DL ops and transports are
all picked by a name that comes from a user (a CLI flag, a saved model spec, a request). Each used
to hand-write the same dict + decorator + "unknown X" error, with drifting wording. One helper
keeps the behaviour identical everywhere: registering a name twice is a bug caught at import,
and an unknown name is refused with the known names listed, as the caller's own error type (so a
CLI's `run_cli` prints it as one line).

It is a dict (name -> implementation), so `name in REG`, `sorted(REG)` and `REG[name]` keep working.
It has no dependencies: messenger/ and planner/ stay free of the rest of sparkgnn and keep their
own two-line lookups.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> implementation, with `register` (a decorator) and `lookup` (a clear refusal)."""

    def __init__(self, what: str, error: type[Exception] = ValueError):
        super().__init__()
        self.what = what
        self.error = error

    def register(self, name: str, value: T | None = None):
        """`@REG.register("name")` above a class or function, or `REG.register("name", obj)`."""

        def add(obj: T) -> T:
            if name in self:
                raise ValueError(f"{self.what} {name!r} is registered twice ({self[name]!r} and {obj!r})")
            self[name] = obj
            return obj

        return add(value) if value is not None else add

    def lookup(self, name: str) -> T:
        """The implementation registered as `name`, or `error` naming the known names."""
        try:
            return self[name]
        except (KeyError, TypeError):
            raise self.error(f"unknown {self.what} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self)
