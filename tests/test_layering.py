"""The dependency between ``rl_lightning`` and ``callbacks`` runs one way: they meet only through config.

``callbacks`` is generic (torch + lightning + tensordict) and must not import ``rl_lightning``;
``rl_lightning`` must not import ``callbacks`` (it instantiates them from ``_target_`` strings). Because
``callbacks`` is a generic top-level name, ``import callbacks`` must also resolve to this repository (the
test folder ``tests/callbacks`` is on the path too). Inside ``rl_lightning`` there is no import cycle and
the layers stay in order; and test modules share code through ``tests/helpers/``, never by importing one
another.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def import_module_argument(node: ast.AST) -> str | None:
    """The module named by ``node`` if it is an ``importlib.import_module("name")`` call, else ``None``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def imported_top_level_names(package_dir: Path) -> dict[str, set[str]]:
    """``{file: {top-level module names it imports}}`` for every .py file under ``package_dir``."""
    found: dict[str, set[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif (module := import_module_argument(node)) is not None:
                names.add(module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_callbacks_never_import_rl_lightning() -> None:
    scanned = imported_top_level_names(ROOT / "callbacks")
    assert scanned, "no sources found under callbacks/"
    offenders = [path for path, names in scanned.items() if "rl_lightning" in names]
    assert offenders == [], f"callbacks must stay generic; these import rl_lightning: {offenders}"


def test_callbacks_depend_only_on_torch_lightning_tensordict() -> None:
    allowed = {"callbacks", "torch", "lightning", "lightning_utilities", "tensordict", "typing_extensions"}
    allowed |= {"pynvml"}  # optional, imported lazily by GPUMonitor
    stdlib = set(__import__("sys").stdlib_module_names) | {"__future__"}
    for path, names in imported_top_level_names(ROOT / "callbacks").items():
        extra = names - allowed - stdlib
        assert not extra, f"{path} imports {extra}; callbacks may use torch, lightning and tensordict only"


def test_rl_lightning_never_imports_callbacks() -> None:
    package = ROOT / "rl_lightning"
    if not any(package.rglob("*.py")):
        pytest.skip("rl_lightning has no sources yet")
    offenders = [path for path, names in imported_top_level_names(package).items() if "callbacks" in names]
    assert offenders == [], f"rl_lightning reaches callbacks through config only; importing: {offenders}"


def test_import_callbacks_resolves_to_this_repository() -> None:
    module = importlib.import_module("callbacks")
    location = Path(module.__file__).resolve()
    assert location.is_relative_to(ROOT), f"`import callbacks` found {location}, not this repository's"
    assert location.parent == ROOT / "callbacks"


# ------------------------------------------------------------------------------- inside rl_lightning
PACKAGE = ROOT / "rl_lightning"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``{module: {rl_lightning modules it imports}}``, function-level imports included.

    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
    """
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("rl_lightning"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - node.level + 1]
                    target = ".".join([*base, node.module] if node.module else base)
                else:
                    target = node.module or ""
                if not target.startswith("rl_lightning"):
                    continue
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
            ):
                continue  # the CLI's lazy command table; its targets are the command modules
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_import_graph_finds_the_modules() -> None:
    graph = import_graph()
    assert "rl_lightning.cli.run" in graph["rl_lightning.cli.fit"]
    assert "rl_lightning.algos.base" in graph["rl_lightning.algos.value_based"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_rl_lightning() -> None:
    cycle = _cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cli_sits_on_top() -> None:
    """Nothing outside ``rl_lightning.cli`` imports it (the entry point ``__main__`` and the Python API
    ``api``, which sit beside the commands on the same builders, aside)."""
    offenders = {
        module: sorted(d for d in deps if d.startswith("rl_lightning.cli"))
        for module, deps in import_graph().items()
        if not module.startswith("rl_lightning.cli")
        and module not in ("rl_lightning.__main__", "rl_lightning.api", "rl_lightning")
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_algorithms_know_neither_the_data_module_nor_the_training_loop() -> None:
    offenders = {
        module: sorted(d for d in deps if d.split(".")[1] in ("data", "training", "cli"))
        for module, deps in import_graph().items()
        if module.startswith("rl_lightning.algos")
    }
    assert {m: d for m, d in offenders.items() if d} == {}
    for path in (PACKAGE / "algos").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "datamodule" not in text and "trainer." not in text, f"{path} reaches across the protocol"


# ------------------------------------------------------------------------------- tests import helpers only
def imports_of_test_modules(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every import in ``source`` of a test module (``test_*``) or of ``conftest``:
    ``import test_x``, ``from test_x import y``, ``from pkg import test_x``, ``importlib.import_module``."""

    def is_test_module(name: str) -> bool:
        return any(part.startswith("test_") or part == "conftest" for part in name.split("."))

    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = (
                [module] if is_test_module(module) else [f"{module}.{a.name}".lstrip(".") for a in node.names]
            )
        elif (module := import_module_argument(node)) is not None:
            names = [module]
        found += [(node.lineno, name) for name in names if is_test_module(name)]
    return sorted(found)


def test_the_check_finds_imports_of_test_modules() -> None:
    source = (
        "import test_a\nfrom test_b import x\nfrom . import test_c\nfrom conftest import y\n"
        "import importlib\nimportlib.import_module('test_d')\nfrom helpers.fit import K\nimport helpers.cli\n"
    )
    assert imports_of_test_modules(source) == [
        (1, "test_a"), (2, "test_b"), (3, "test_c"), (4, "conftest"), (6, "test_d"),
    ]  # fmt: skip


def test_no_test_module_imports_another() -> None:
    """A test module that imports another runs the other's module-level code (fixtures, collection hooks,
    its own imports) and ties two files together; what they share belongs in ``tests/helpers/``."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(tests) > 50 and any(path.parent != ROOT / "tests" for path in tests)
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in tests
        for line, name in imports_of_test_modules(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "import from tests/helpers/ instead:\n" + "\n".join(offenders)
