"""No private name of a dependency outside the compatibility modules.

Every private (``_``-prefixed, not dunder) name of torch, TensorDict, TorchRL, Lightning, the standard
library or any other package that ``rl_lightning/`` and ``callbacks/`` use lives in ``rl_lightning/compat.py``
or ``callbacks/_compat.py``, each behind a version check with a public fallback (``tests/test_compat.py``).
This test parses every other file and fails on:

- an import of a private name or from a private module of a dependency (``from torchrl._utils import x``,
  ``from lightning... import _TransferableDataType``, ``import torch._dynamo``);
- a private attribute of a dependency's module or object imported by name (``torch._foreach_add_``,
  ``threading._shutdown``, ``TensorDict._new_unsafe``);
- on ``self``, ``cls``, ``type(self)`` or ``super()`` in a class, or as a method defined in it: a private name
  that a dependency's class in its bases defines or assigns (``self._trainer`` in a ``LightningModule``,
  an override of ``SliceSampler._get_stop_and_length``), found by importing the class;
- on any other object (``logger._experiment``, ``td._tensordict``): a private name that the project's own
  code never defines (as a function, class, class attribute or attribute it assigns);
- the same names given as strings to ``getattr``, ``setattr``, ``hasattr`` or ``delattr``;
- a write through an object's ``__dict__`` to a public attribute name (``m.__dict__["training"] = ...``),
  which goes around the attribute machinery of the object's class.

Allowed: the project's own private names (``self._cache``, ``from callbacks._logging import ...``), names
the standard library documents as public (``os._exit``, a named tuple's ``_replace``) and Hydra's
``_target_``-style keys.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rl_lightning", "callbacks")
#: The modules that may hold private names of dependencies.
COMPAT_MODULES = {"rl_lightning/compat.py", "callbacks/_compat.py"}
#: Underscored names that their owners document as public: ``os._exit`` (the os module's docs), a named
#: tuple's methods and fields (``collections.namedtuple``'s docs), ``sys._getframe``.
PUBLIC_UNDERSCORED = {"_exit", "_replace", "_asdict", "_fields", "_field_defaults", "_make", "_getframe"}
#: Hydra's reserved config keys (``cfg.algo._target_``): its documented interface.
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
#: Lightning's loops (``trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress``): public
#: names, internal structure that changes between releases.
LOOP_INTERNALS = {"epoch_loop", "manual_optimization", "automatic_optimization_loop", "optim_step_progress"}
#: ``getattr``-style builtins whose second argument names an attribute.
ATTRIBUTE_BUILTINS = {"getattr", "setattr", "hasattr", "delattr"}


def is_private(name: str) -> bool:
    """A leading underscore, not a dunder, not a Hydra key, not a documented public one."""
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in HYDRA_KEYS | PUBLIC_UNDERSCORED


def is_own_module(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def own_private_names(trees: Iterable[ast.AST]) -> set[str]:
    """Private names the project's code defines: functions, classes, class attributes, module globals,
    attributes it assigns (``x._y = ...``) and parameters (keyword arguments of its own calls)."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (  # setattr(x, "_y", ...), object.__setattr__(x, "_y", ...)
                isinstance(node, ast.Call)
                and (ast.unparse(node.func) in ("setattr", "object.__setattr__"))
                and len(node.args) == 3
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                names.add(node.args[1].value)
    return {n for n in names if is_private(n)}


class ForeignClassNames:
    """Which private names the dependencies' classes in a class's bases define or assign (cached)."""

    def __init__(self) -> None:
        self._source_names: dict[type, set[str]] = {}

    def _names_of(self, cls: type) -> set[str]:
        if cls not in self._source_names:
            names = {n for n in vars(cls) if is_private(n)}
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):
                source = ""
            names |= {m for m in re.findall(r"\bself\.(_\w+)\s*(?::[^=\n]*)?=[^=]", source) if is_private(m)}
            names |= {m for m in re.findall(r"\bself\.(_\w+)\b", source) if is_private(m)}
            self._source_names[cls] = names
        return self._source_names[cls]

    def owner(self, cls: type, name: str) -> type | None:
        """The first dependency's class in ``cls``'s MRO that knows the private ``name``, else ``None``.

        A method a dependency's class declares abstract (TorchRL's ``EnvBase._step``, ``Sampler._empty``)
        is the interface it asks subclasses to implement, not a private name."""
        bases = [b for b in cls.__mro__ if b is not object and not is_own_module(b.__module__ or "")]
        if any(name in getattr(b, "__abstractmethods__", ()) for b in bases):
            return None
        for base in bases:
            if name in self._names_of(base):
                return base
        return None


FOREIGN = ForeignClassNames()


class Scanner(ast.NodeVisitor):
    """Collects the private names of dependencies that one module uses (see the module docstring)."""

    def __init__(self, path: str, namespace: dict, own_names: set[str]) -> None:
        self.path, self.namespace, self.own_names = path, namespace, own_names
        self.found: list[str] = []
        self.foreign_aliases: dict[str, str] = {}  # local name -> the dependency's qualified name
        self.classes: list[type | None] = []  # the enclosing classes (None: not found at runtime)

    def report(self, node: ast.AST, what: str) -> None:
        self.found.append(f"{self.path}:{node.lineno}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if is_own_module(alias.name):
                continue
            if any(is_private(part) for part in alias.name.split(".")):
                self.report(node, f"import {alias.name}")
            self.foreign_aliases[alias.asname or alias.name.split(".")[0]] = alias.asname or alias.name
            if alias.asname is None:
                self.foreign_aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or is_own_module(node.module) or node.module == "__future__":
            return
        private_module = any(is_private(part) for part in node.module.split("."))
        for alias in node.names:
            if private_module or is_private(alias.name):
                self.report(node, f"from {node.module} import {alias.name}")
            self.foreign_aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        cls = self.namespace.get(node.name) if not self.classes else None
        if len(self.classes) and self.classes[-1] is not None:
            cls = vars(self.classes[-1]).get(node.name)
        cls = cls if isinstance(cls, type) else None
        if cls is not None:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and is_private(item.name):
                    owner = FOREIGN.owner(cls, item.name)
                    if owner is not None:
                        self.report(item, f"overrides {owner.__module__}.{owner.__qualname__}.{item.name}")
        self.classes.append(cls)
        self.generic_visit(node)
        self.classes.pop()

    def _is_instance_ref(self, node: ast.AST) -> bool:
        """``self``, ``cls``, ``type(self)`` or ``super()`` inside a class."""
        if isinstance(node, ast.Name):
            return node.id in ("self", "cls")
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and (
                node.func.id == "super"
                or (node.func.id == "type" and len(node.args) == 1 and self._is_instance_ref(node.args[0]))
            )
        )

    def _root_alias(self, node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        if isinstance(node, ast.Name):
            return self.foreign_aliases.get(node.id)
        return None

    def check_access(self, node: ast.AST, base: ast.AST, name: str) -> None:
        if not is_private(name):
            return
        foreign = self._root_alias(base)
        if foreign is not None:
            self.report(node, f"{ast.unparse(base)}.{name} ({foreign})")
        elif self.classes and self._is_instance_ref(base):
            cls = self.classes[-1]
            owner = FOREIGN.owner(cls, name) if cls is not None else None
            if owner is not None:
                self.report(node, f"{ast.unparse(base)}.{name} of {owner.__module__}.{owner.__qualname__}")
        elif name not in self.own_names:
            self.report(node, f"{ast.unparse(base)}.{name} (not defined by the project)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.check_access(node, node.value, node.attr)
        if node.attr in LOOP_INTERNALS:
            self.report(node, f"{ast.unparse(node)} (Lightning's loop internals)")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "__dict__"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
            and not node.slice.value.startswith("_")
        ):
            self.report(node, f"{ast.unparse(node)} (around the class's attribute machinery)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ATTRIBUTE_BUILTINS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self.check_access(node, node.args[0], node.args[1].value)
        self.generic_visit(node)


def scan(path: str, tree: ast.AST, namespace: dict, own_names: set[str]) -> list[str]:
    scanner = Scanner(path, namespace, own_names)
    scanner.visit(tree)
    return scanner.found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_sources() -> dict[str, tuple[Path, ast.AST]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found[rel] = path, ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    return found


@pytest.mark.slow  # imports every module of the project to find its classes' bases: 20 s on a cold process
def test_no_private_name_of_a_dependency_outside_the_compat_modules() -> None:
    sources = project_sources()
    assert len(sources) > 50 and sources.keys() >= COMPAT_MODULES
    own = own_private_names(tree for rel, (_, tree) in sources.items() if rel not in COMPAT_MODULES)
    found = []
    for rel, (path, tree) in sources.items():
        if rel in COMPAT_MODULES:
            continue
        namespace = vars(importlib.import_module(module_name(path)))
        found += scan(rel, tree, namespace, own)
    assert not found, "private names of dependencies outside the compat modules:\n" + "\n".join(found)


def _scan_source(source: str, exec_module: bool = True) -> list[str]:
    """Scans ``source`` as a module of the project (executed to resolve its classes)."""
    tree = ast.parse(source)
    namespace: dict = {"__name__": "rl_lightning._scanned", "__builtins__": builtins}
    if exec_module:
        module = types.ModuleType("rl_lightning._scanned")
        sys.modules[module.__name__] = module
        try:
            exec(compile(tree, "scanned.py", "exec"), vars(module))
        finally:
            del sys.modules[module.__name__]
        namespace = vars(module)
    return scan("scanned.py", tree, namespace, own_private_names([tree]))


PLANTED: list[tuple[str, str]] = [
    ("import torch\ntorch._foreach_add_", "torch._foreach_add_"),
    ("import threading\nthreading._shutdown", "threading._shutdown"),  # named, not called: the scan runs it
    ("from torchrl._utils import _replace_last", "from torchrl._utils import _replace_last"),
    ("from lightning.fabric.utilities.apply_func import _TransferableDataType", "_TransferableDataType"),
    ("import torch._dynamo", "import torch._dynamo"),
    ("from tensordict import TensorDict\nTensorDict._new_unsafe", "TensorDict._new_unsafe"),
    ("def f(logger):\n    return logger._experiment", "logger._experiment"),
    ("def f(env):\n    return getattr(env, '_frameskip', 1)", "env._frameskip"),
    ("def f(m):\n    m.__dict__['training'] = False", "__dict__['training']"),
    ("def f(trainer):\n    return trainer.fit_loop.epoch_loop", "Lightning's loop internals"),
    (
        "import lightning.pytorch as pl\nclass M(pl.LightningModule):\n    def f(self):\n"
        "        return self._trainer",
        "self._trainer of lightning.pytorch.core.module.LightningModule",
    ),
    (
        "import torch\nclass M(torch.nn.Module):\n    def _apply(self, fn, recurse=True):\n"
        "        return super()._apply(fn, recurse)",
        "overrides torch.nn.modules.module.Module._apply",
    ),
]


@pytest.mark.parametrize(("source", "expected"), PLANTED, ids=[e for _, e in PLANTED])
def test_the_scan_finds_a_private_name_put_back(source: str, expected: str) -> None:
    found = _scan_source(source)
    assert any(expected in line for line in found), found


def test_the_projects_own_private_names_pass() -> None:
    source = (
        "import os\nimport torch\nfrom collections import namedtuple\n"
        "P = namedtuple('P', 'a')\n"
        "class Cache(torch.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self._store = {}\n"
        "    def _fill(self):\n        return self._store\n"
        "def g(c, cfg):\n    os._exit\n    P(1)._replace(a=2)\n    cfg._target_\n    return c._fill()\n"
    )
    assert _scan_source(source) == []
