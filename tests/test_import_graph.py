"""The package-level import graph of sparkgnn: acyclic, and messenger/ and planner/ are leaves.

Every import counts: top-level, inside functions (lazy), under TYPE_CHECKING, relative, and
`importlib.import_module("...")` with a literal name. Each first-level package of sparkgnn
(sparkgnn.graph, .engine, .serving, .dl, .runners, .messenger, .planner, ...) is a node, and so is
each top-level module (sparkgnn.errors, .registry, .files, .cliargs, .outputs, .arrowvec) and the
package root itself ("sparkgnn", its __init__). A lazy import still makes a cycle: the two
packages can no longer be understood, tested or shipped one without the other.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# where each part of the installed package lives (setup.py maps planner/ and messenger/)
SOURCES = {
    "sparkgnn": ROOT / "python" / "sparkgnn",
    "sparkgnn.planner": ROOT / "planner",
    "sparkgnn.messenger": ROOT / "messenger",
}
LEAVES = ("messenger", "planner")


def _nodes() -> set[str]:
    base = SOURCES["sparkgnn"]
    names = {p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    names |= {p.stem for p in base.glob("*.py") if p.stem != "__init__"}
    return names | set(LEAVES)


def _modules():
    """(module name, path) of every module of the installed package."""
    for prefix, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if prefix == "sparkgnn" and rel.parts[0] in LEAVES or "__pycache__" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([prefix, *parts]), path


def _imported(module: str, path: pathlib.Path):
    """(line, imported name) for every import in the module; `from a import b` gives a.b (b may
    be a submodule or an attribute: `from sparkgnn import infer` is the root package's)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _node(name: str, nodes: set[str]) -> str | None:
    """The graph node of an imported name: None outside sparkgnn; "sparkgnn" for the root package
    (and attributes it defines, e.g. `from sparkgnn import infer`)."""
    parts = name.split(".")
    if parts[0] != "sparkgnn":
        return None
    if len(parts) == 1 or parts[1] not in nodes:
        return "sparkgnn"
    return parts[1]


def import_graph() -> dict[tuple[str, str], list[str]]:
    """(importer node, imported node) -> where ("path:line"), over the whole package."""
    nodes = _nodes()
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in _modules():
        source = _node(module, nodes)
        for line, name in _imported(module, path):
            target = _node(name, nodes)
            if target is None or target == source:
                continue
            edges.setdefault((source, target), []).append(f"{path.relative_to(ROOT)}:{line}")
    return edges


def find_cycle(edges) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def describe(edges) -> str:
    return "\n".join(f"  {a} -> {b}  ({len(w)}x, e.g. {w[0]})" for (a, b), w in sorted(edges.items()))


def test_the_import_graph_sees_lazy_and_relative_imports(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text(
        "import sparkgnn.graph\nfrom . import x\n"
        "def f():\n    from sparkgnn.serving.engine import QueryEngine\n"
        "    import importlib; importlib.import_module('sparkgnn.pe')\n"
    )
    names = [name for _, name in _imported("sparkgnn.engine.m", probe)]
    assert "sparkgnn.graph" in names and "sparkgnn.engine.x" in names
    assert "sparkgnn.serving.engine.QueryEngine" in names and "sparkgnn.pe" in names
    assert find_cycle({("a", "b"): [], ("b", "c"): [], ("c", "a"): []}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"): [], ("a", "c"): [], ("b", "c"): []}) is None


def test_the_package_graph_is_acyclic():
    edges = import_graph()
    assert ("engine", "runners") in edges and ("serving", "runners") in edges  # the graph is not empty
    cycle = find_cycle(edges)
    assert cycle is None, (
        f"import cycle between packages: {' -> '.join(cycle)}\n"
        + "\n".join(f"  {a} -> {b}: {', '.join(edges[(a, b)][:3])}" for a, b in zip(cycle, cycle[1:], strict=False))
        + f"\nall edges:\n{describe(edges)}"
    )


def test_messenger_and_planner_import_nothing_else_of_sparkgnn():
    offenders = {edge: where for edge, where in import_graph().items() if edge[0] in LEAVES}
    assert offenders == {}, describe(offenders)


def test_the_leaves_have_their_own_error_bases():
    from sparkgnn.errors import USER_ERRORS, PlanError, SparkGNNError
    from sparkgnn.messenger.errors import MessengerError, TransportError
    from sparkgnn.messenger.protocol import ProtocolError
    from sparkgnn.planner.errors import PlanError as PlannerPlanError

    assert PlanError is PlannerPlanError and issubclass(PlanError, ValueError)
    assert issubclass(TransportError, MessengerError) and issubclass(ProtocolError, MessengerError)
    assert not issubclass(MessengerError, SparkGNNError) and not issubclass(PlanError, SparkGNNError)
    assert set(USER_ERRORS) == {SparkGNNError, MessengerError, PlanError}


def test_dl_does_not_import_serving_and_its_ops_are_registered_by_the_roots():
    edges = import_graph()
    assert ("dl", "serving") not in edges and ("dl", "engine") not in edges
    assert ("worker", "serving") in edges  # sparkgnn-worker registers serving's ops
    import sparkgnn.dl.handler  # noqa: F401  (registers layer_step)
    import sparkgnn.serving  # noqa: F401  (registers serving_partials)
    from sparkgnn.dl.ops import OPS

    assert {"layer_step", "serving_partials"} <= set(OPS.names())


if __name__ == "__main__":  # print the graph: python tests/test_import_graph.py
    print(describe(import_graph()))
