"""Generates the configuration reference (docs/reference/configuration.md) from conf/.

Every group, option and key is listed with its default and the YAML comment that explains it, so the
reference cannot drift from the config. Runs as an mkdocs hook before each build, or by hand:
``python docs/gen_config_reference.py``.
"""

from __future__ import annotations

import html
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
OUT = ROOT / "docs" / "reference" / "configuration.md"


def _split_comment(line: str) -> tuple[str, str]:
    """Splits ``line`` at the first ``#`` that is not inside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if ch in "'\"":
            quote = None if quote == ch else (ch if quote is None else quote)
        elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def parse(path: Path) -> tuple[str, list[tuple[str, str, str]]]:
    """The file's description (its leading comments) and rows ``(dotted key, default, comment)``."""
    lines = path.read_text().splitlines()
    description = []
    for line in lines:
        if not line.startswith("#"):
            break
        text = line.lstrip("# ").strip()
        if not text.startswith("@package"):
            description.append(text)
    rows: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []
    in_defaults = False
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        body, comment = _split_comment(line)
        indent = len(body) - len(body.lstrip())
        stripped = body.strip()
        if stripped.startswith("- "):
            if in_defaults:
                rows.append(("defaults", stripped[2:], comment))
            continue
        if ":" not in stripped:
            continue
        key, value = stripped.split(":", 1)
        key, value = key.strip(), value.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        in_defaults = key == "defaults" and indent == 0
        if in_defaults:
            continue
        dotted = ".".join([k for _, k in stack] + [key])
        if value == "":
            stack.append((indent, key))
            if comment:
                rows.append((dotted, "", comment))
        else:
            rows.append((dotted, value, comment))
    return " ".join(description), rows


def _text(comment: str) -> str:
    """A YAML comment as Markdown table text: ``<name>`` is HTML to a browser, so it is escaped."""
    return html.escape(comment, quote=False).replace("|", "\\|")


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    out = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, default, comment in rows:
        default, comment = default.replace("|", "\\|"), _text(comment)
        shown = f"`{default}`" if default else ""
        out.append(f"| `{key}` | {shown} | {comment} |")
    return out


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `conf/` by `docs/gen_config_reference.py` at every docs build: every group, option,",
        "default and the comment that explains it. Override any key on the command line, for example",
        "`python -m rl_lightning fit +experiment=dqn_cartpole total_frames=20000 algo.double_dqn=true`;",
        "pick a group option with `group=option` (for example `env=pendulum`, `logger=none`).",
        "",
    ]
    desc, rows = parse(CONF / "config.yaml")
    lines += ["## Root config (`conf/config.yaml`)", "", _text(desc), "", *_table(rows), ""]
    for group in sorted(p for p in CONF.iterdir() if p.is_dir()):
        lines += [f"## Group `{group.name}`", ""]
        for path in sorted(group.glob("*.yaml")):
            desc, rows = parse(path)
            lines += [f"### `{group.name}={path.stem}`", "", _text(desc or ""), ""]
            if group.name == "experiment":
                lines += [f"Run it: `python -m rl_lightning fit +experiment={path.stem}`", ""]
            if rows:
                lines += [*_table(rows), ""]
    return "\n".join(lines) + "\n"


def write() -> Path:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    return OUT


def on_pre_build(config: object) -> None:  # mkdocs hook
    write()


if __name__ == "__main__":
    print(write())
