"""Callbacks read the data path through its progress view only: no file of ``callbacks/`` or
``rl_lightning/training/`` reads ``trainer.datamodule`` beyond ``.progress`` (a static check)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "callbacks", ROOT / "rl_lightning" / "training")


def _is_getattr_of(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value == name
    )


def reads_beyond_the_view(source: str) -> list[int]:
    """The lines of ``source`` that take the data module (``x.datamodule`` or ``getattr(x, "datamodule")``)
    for anything but its ``progress`` (``.progress`` or ``getattr(..., "progress")``)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        takes_dm = (isinstance(node, ast.Attribute) and node.attr == "datamodule") or _is_getattr_of(
            node, "datamodule"
        )
        if not takes_dm:
            continue
        parent = parents.get(node)
        to_view = (
            isinstance(parent, ast.Attribute) and parent.attr == "progress" and parent.value is node
        ) or (_is_getattr_of(parent, "progress") and parent.args[0] is node)
        if not to_view:
            lines.append(node.lineno)
    return lines


def test_callbacks_read_the_data_module_through_the_progress_view_only() -> None:
    offenders = {}
    for folder in SCANNED:
        for path in sorted(folder.rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            lines = reads_beyond_the_view(path.read_text(encoding="utf-8"))
            if lines:
                offenders[name] = lines
    assert offenders == {}, f"read trainer.datamodule.progress, nothing else of the data module: {offenders}"


def test_the_check_sees_reads_beyond_the_view() -> None:
    assert reads_beyond_the_view("f = trainer.datamodule.progress.frames") == []
    assert reads_beyond_the_view('p = getattr(getattr(trainer, "datamodule", None), "progress", None)') == []
    assert reads_beyond_the_view("f = trainer.datamodule.frames") == [1]
    assert reads_beyond_the_view("dm = trainer.datamodule\nf = dm.progress.frames") == [1]
    assert reads_beyond_the_view('f = getattr(trainer.datamodule, "collect")') == [1]
    assert reads_beyond_the_view("if trainer.datamodule is not None: pass") == [1]
