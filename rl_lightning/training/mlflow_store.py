"""A new SQLite MLflow store made from a copy of an empty one instead of MLflow's schema migrations.

MLflow makes a new SQLite store by running every Alembic migration of its schema, about 1.4 s of a CPU
(and 2 s of a run's start-up with the imports they need) whatever the store will hold. The result is the
same empty schema each time for one MLflow version. :func:`prepare_sqlite_store` keeps that empty store
once per MLflow version and schema revision in the user's cache directory, made by MLflow's own
migrations, and copies it to a store path that does not exist yet. MLflow then opens the copy as an
existing store: it checks the schema revision and adds its ``Default`` experiment, whose artifact location
it resolves then, as for a store it made itself (``tests/training/test_mlflow_store.py`` compares the two).

Anything that goes wrong on this path (an unwritable cache, a file system without hard links, an MLflow
whose internals moved) leaves the path as it was, and MLflow makes the store itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["prepare_sqlite_store", "template_dir"]

_log = logging.getLogger(__name__)


def template_dir() -> Path:
    """Where the empty stores are kept: ``$XDG_CACHE_HOME/rl_lightning`` (default ``~/.cache``)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "rl_lightning"


def _sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI; ``None`` for other stores, in-memory databases and URI options."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or "?" in uri:
        return None
    name = uri[len(prefix) :]
    if not name or name == ":memory:":
        return None
    return Path(name)


def _template() -> Path:
    """The empty store of the installed MLflow, made by its migrations the first time it is asked for."""
    import mlflow
    import sqlalchemy

    from rl_lightning.compat import mlflow_schema_tools

    tools = mlflow_schema_tools()
    if tools is None:
        raise RuntimeError("this MLflow's schema functions are not known to rl_lightning.compat")
    latest_revision, initialize_tables = tools

    directory = template_dir()
    path = directory / f"mlflow-{mlflow.__version__}-{latest_revision()}.db"
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".db.tmp")
    os.close(fd)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, path)  # whole or not at all; a concurrent maker writes the same schema
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def prepare_sqlite_store(uri: str) -> bool:
    """Puts an empty MLflow store at the file of ``uri`` when ``uri`` is ``sqlite:///`` and the file is new.

    Returns:
        ``True`` when the store was copied; ``False`` when the path was left alone: another kind of store,
        an existing file or a missing directory (MLflow reports those), or a failure of the template.
    """
    path = _sqlite_path(uri)
    if path is None or path.exists() or not path.parent.is_dir():
        return False
    try:
        template = _template()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            shutil.copyfile(template, tmp)
            os.link(tmp, path)  # fails if another process made the store meanwhile: theirs stays
        finally:
            os.unlink(tmp)
    except Exception as err:  # MLflow makes the store itself, as without a template
        _log.debug("MLflow store template not used for %s: %r", path, err)
        return False
    return True
