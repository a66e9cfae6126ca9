"""README.md and docs/ARCHITECTURE.md against the code: the claims a reader can check are checked.

- every module path and dotted name they write in backticks exists (`engine/api.py`,
  `spark_jobs/refresh_pe.py`, `sparkgnn.serving.MODES`, `steps.run_step`, ...);
- the import rules ARCHITECTURE.md states are the code's: its list of the modules that import
  pyspark is the set that does, and its layering chains have no import pointing up;
- the names it lists are the registered ones: the handler ops (`dl.ops.OPS`), the planner IR's
  operators (`planner.ir.OPERATORS`), the registries it calls registries, the Makefile's bench
  targets.

WHY: both documents describe the code as it stands; a rename, a new module that imports pyspark or
a new op then fails here, naming the sentence to update, instead of leaving the map wrong.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

from test_import_graph import import_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "sparkgnn"
DOCS = ("README.md", "docs/ARCHITECTURE.md")
# folders a path in the documents may start from: the repository, the package (`engine/api.py`)
PATH_ROOTS = (ROOT, PACKAGE, ROOT / "python")
CODE_FOLDERS = ("python", "planner", "messenger", "spark_jobs", "bench", "tests", "jvm", "examples", "docs")
SUBPACKAGES = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {"planner", "messenger"}
# a dotted word ending like a file name is a file, not an attribute (`model.json`, `start-worker.sh`)
FILE_SUFFIXES = ("py", "json", "arrow", "parquet", "sh", "npz", "vec", "md", "png", "jar", "sbt", "orc", "txt")


def _text(doc: str) -> str:
    return (ROOT / doc).read_text()


def _spans(text: str) -> list[str]:
    """The text inside single backticks (code blocks are not spans: they are examples)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def _python_files() -> list[pathlib.Path]:
    return [
        path for folder in CODE_FOLDERS for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts
    ]


def _module_names() -> dict[str, list[str]]:
    """Last name of every module of the installed package -> its dotted names (`steps` ->
    [sparkgnn.engine.steps])."""
    stems: dict[str, list[str]] = {}
    for base, prefix in (
        (PACKAGE, "sparkgnn"),
        (ROOT / "planner", "sparkgnn.planner"),
        (ROOT / "messenger", "sparkgnn.messenger"),
    ):
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if "__pycache__" in parts or (prefix == "sparkgnn" and parts[0] in ("planner", "messenger")):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts:
                stems.setdefault(parts[-1], []).append(".".join([prefix, *parts]))
    return stems


def _resolves(name: str) -> bool:
    """Whether `name` is a module of the package or an attribute of one (imported for real)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _path_exists(token: str) -> bool:
    """A path from the repository or the package root; a bare file name (`server.py`, named in its
    section's context) anywhere in the code."""
    if any((root / token).exists() for root in PATH_ROOTS):
        return True
    return "/" not in token and any(path.name == token for path in _python_files())


def _is_code_path(token: str) -> bool:
    first = token.split("/")[0]
    return token.endswith(".py") or (token.endswith("/") and (first in CODE_FOLDERS or first in SUBPACKAGES))


def test_every_module_path_and_dotted_name_in_the_documents_exists():
    stems = _module_names()
    missing = []
    for doc in DOCS:
        for span in _spans(_text(doc)):
            for token in re.findall(r"(?<![\w/.<>=*-])([\w][\w/.-]*\.py|[\w][\w/]*/)(?![\w*<>=])", span):
                if _is_code_path(token) and not _path_exists(token):
                    missing.append(f"{doc}: path `{token}` (in `{span}`)")
            for token in re.findall(r"(?<![\w./<>-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w-])", span):
                parts = token.split(".")
                if parts[-1] in FILE_SUFFIXES:
                    continue
                if parts[0] == "sparkgnn" or parts[0] in SUBPACKAGES:
                    name = token if parts[0] == "sparkgnn" else f"sparkgnn.{token}"
                    if not _resolves(name):
                        missing.append(f"{doc}: `{token}` (in `{span}`)")
                elif parts[0] in stems:  # module.attribute, the module named by its last name
                    rest = ".".join(parts[1:])
                    if not any(_resolves(f"{module}.{rest}") for module in stems[parts[0]]):
                        missing.append(f"{doc}: `{token}` (in `{span}`; module {' or '.join(stems[parts[0]])})")
    assert not missing, "names in the documents that the code does not have:\n" + "\n".join(missing)


def test_the_path_check_catches_what_is_gone():
    assert _path_exists("engine/api.py") and _path_exists("spark_jobs/refresh_pe.py")
    assert _path_exists("planner/serving.py") and _path_exists("serving/online/")
    assert not _path_exists("engine/no_such_module.py") and not _path_exists("no_such_module.py")
    assert _resolves("sparkgnn.engine.exchange.routed_files") and _resolves("sparkgnn.dl.ops.OPS")
    assert not _resolves("sparkgnn.engine.exchange.no_such_function") and not _resolves("sparkgnn.no_such")


# ---- import rules ---------------------------------------------------------------------------------


def _architecture_bullet(start: str) -> str:
    """The bullet of ARCHITECTURE.md's dependency rules that starts with `start`, up to the next."""
    text = _text("docs/ARCHITECTURE.md")
    found = re.search(rf"^- {re.escape(start)}.*?(?=^- |^\S|\Z)", text, flags=re.S | re.M)
    assert found, f"docs/ARCHITECTURE.md has no bullet starting '- {start}'"
    return found.group(0)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _pyspark_imports(path: pathlib.Path) -> tuple[bool, bool]:
    """(imports pyspark anywhere outside TYPE_CHECKING, imports it when the module is imported)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            in_function.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    anywhere = at_import = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if node.lineno in skip or not any(n == "pyspark" or n.startswith("pyspark.") for n in names):
            continue
        anywhere = True
        at_import = at_import or node.lineno not in in_function
    return anywhere, at_import


def _package_relative(path: pathlib.Path) -> str:
    """How ARCHITECTURE.md names a module: relative to the package (`engine/steps.py`) or the repo."""
    return str(path.relative_to(PACKAGE if PACKAGE in path.parents else ROOT))


def test_the_modules_that_import_pyspark_are_the_ones_architecture_lists():
    bullet = _architecture_bullet("pyspark is imported inside functions only")
    listed_part = bullet.split("Only these modules import it:", 1)
    assert len(listed_part) == 2, "the pyspark bullet lost its 'Only these modules import it:' list"
    listed = set(re.findall(r"`([\w/]+\.py)`", listed_part[1].split("Everything else", 1)[0]))
    importing, at_import = set(), []
    for folder in ("python", "planner", "messenger", "spark_jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            anywhere, eager = _pyspark_imports(path)
            if anywhere:
                importing.add(_package_relative(path))
            if eager:
                at_import.append(_package_relative(path))
    assert at_import == [], (
        f"modules importing pyspark when they are imported (the rule: inside functions): {at_import}"
    )
    assert listed == importing, (
        "docs/ARCHITECTURE.md's list of the modules importing pyspark is out of date: "
        f"listed but not importing {sorted(listed - importing)}, importing but not listed {sorted(importing - listed)}"
    )


def test_the_pyspark_scan_sees_lazy_imports_and_skips_type_checking(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pyspark.sql import DataFrame\n"
        "def f():\n    from pyspark.sql import functions as F\n"
    )
    assert _pyspark_imports(probe) == (True, False)
    probe.write_text("import pyspark.sql\n")
    assert _pyspark_imports(probe) == (True, True)
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pyspark\n")
    assert _pyspark_imports(probe) == (False, False)


def test_the_layering_architecture_states_has_no_import_pointing_up():
    bullet = _architecture_bullet("Layering, bottom up")
    chains = [re.findall(r"`(\w+)`", chain) for chain in re.findall(r"`\w+`(?:\s*->\s*`\w+`)+", bullet)]
    assert chains and all(len(chain) >= 2 for chain in chains), f"no layering chain in: {bullet}"
    edges = import_graph()
    upward = [
        f"{low} imports {high} ({', '.join(edges[(low, high)][:2])})"
        for chain in chains
        for i, low in enumerate(chain)
        for high in chain[i + 1 :]
        if (low, high) in edges
    ]
    assert upward == [], "docs/ARCHITECTURE.md's layering is not the code's:\n" + "\n".join(upward)
    # every name is a package the import graph knows, and consecutive layers really depend
    nodes = {a for a, _ in edges} | {b for _, b in edges}
    assert {name for chain in chains for name in chain} <= nodes
    # and the chain is a dependency order, not an arbitrary list: each layer imports the one below
    not_below = [
        f"{high} does not import {low}"
        for chain in chains
        for low, high in zip(chain, chain[1:], strict=False)
        if (high, low) not in edges
    ]
    assert not_below == [], not_below


# ---- registered names -----------------------------------------------------------------------------


def test_the_handler_ops_architecture_lists_are_the_registered_ones():
    import sparkgnn.dl.handler  # noqa: F401  (registers layer_step)
    import sparkgnn.serving  # noqa: F401  (registers serving's ops)
    from sparkgnn.dl.ops import OPS

    bullet = _text("docs/ARCHITECTURE.md")
    found = re.search(r"Ops \(`dl\.ops\.OPS`[^;]*; the ops are (.*?)\):", bullet, flags=re.S)
    assert found, "docs/ARCHITECTURE.md lost its 'Ops (`dl.ops.OPS`...; the ops are ...)' list"
    listed = re.findall(r"`(\w+)`", found.group(1))
    assert sorted(listed) == sorted(OPS.names()), f"listed {listed}, registered {OPS.names()}"


def test_the_ir_vocabulary_architecture_lists_is_the_planners():
    from sparkgnn.planner.ir import OPERATORS

    found = re.search(
        r"The vocabulary\s+\(`planner\.ir\.OPERATORS`\) is (.*?)\(a lineage", _text("docs/ARCHITECTURE.md"), flags=re.S
    )
    assert found, "docs/ARCHITECTURE.md lost its 'The vocabulary (`planner.ir.OPERATORS`) is ...' sentence"
    listed = re.findall(r"`(\w+)`", found.group(1))
    assert listed == list(OPERATORS), f"listed {listed}, planner.ir.OPERATORS {list(OPERATORS)}"


def _registry_names() -> set[str]:
    """Module-level names bound to a `Registry(...)` anywhere in the package."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            target = (
                node.target
                if isinstance(node, ast.AnnAssign)
                else (node.targets[0] if isinstance(node, ast.Assign) else None)
            )
            value = getattr(node, "value", None)
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.Call)
                and getattr(value.func, "id", "") == "Registry"
            ):
                names.add(target.id)
    return names


def test_what_architecture_calls_a_registry_is_one():
    text = _text("docs/ARCHITECTURE.md")
    found = re.search(
        r"Every choice a user makes by name is a registry(.*?)Tables the engine indexes", text, flags=re.S
    )
    assert found, "docs/ARCHITECTURE.md lost its 'Every choice a user makes by name is a registry' paragraph"
    named = {m.split(".")[-1] for m in re.findall(r"`([\w.]*[A-Z_]{3,})`", found.group(1))}
    registries = _registry_names()
    assert {"OPS", "MODES", "SCHEDULERS"} <= registries  # the scan works
    assert named and named <= registries, f"named as registries but plain: {sorted(named - registries)}"


def test_the_makefile_targets_the_documents_name_exist_and_every_bench_target_is_named():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    bench = {t for t in targets if t.startswith("bench-")}
    named = set()
    for doc in DOCS:
        text = _text(doc)
        named |= set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", text, flags=re.M))
        named |= set(re.findall(r"\b(bench-[a-z]+)\b", text))
    assert named - targets == set(), (
        f"make targets the documents name but the Makefile lacks: {sorted(named - targets)}"
    )
    section = _text("docs/ARCHITECTURE.md").split("## Tests, benchmarks, Makefile", 1)
    assert len(section) == 2, "docs/ARCHITECTURE.md lost its 'Tests, benchmarks, Makefile' section"
    unnamed = {t for t in bench if f"`{t}`" not in section[1]}
    assert unnamed == set(), f"bench targets ARCHITECTURE.md's Makefile section does not name: {sorted(unnamed)}"
