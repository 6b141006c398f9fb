"""The dependency between ``rl_lightning`` and ``callbacks`` runs one way: they meet only through config.

``callbacks`` is generic (torch + lightning + tensordict) and must not import ``rl_lightning``;
``rl_lightning`` must not import ``callbacks`` (it instantiates them from ``_target_`` strings). Because
``callbacks`` is a generic top-level name, ``import callbacks`` must also resolve to this repository.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value.split(".")[0])
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
