"""Renderers of the speed and memory tables in docs/ (``docs/gen_tables.py`` merges them with its own)."""

from __future__ import annotations

from collections.abc import Callable

#: Renderer name -> the function that renders its table from its arguments.
TABLES: dict[str, Callable[..., str]] = {}
