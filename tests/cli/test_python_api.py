"""The Python API (docs/python-api.md): the page's examples run as written, with smaller budgets."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import rl_lightning

DOCS = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)


def test_the_stable_names_are_the_apis() -> None:
    from rl_lightning import api

    assert set(rl_lightning.__all__) == {*api.__all__, "__version__"}
    assert all(callable(getattr(rl_lightning, n)) for n in api.__all__)
    with pytest.raises(AttributeError):
        rl_lightning.not_a_name  # noqa: B018


@pytest.mark.slow
def test_the_pages_examples_train_load_and_act(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first example trains DQN (2,000 frames here instead of the page's 20,000), loads its best
    checkpoint and acts on a batch and through an episode; the second builds SAC's parts and fits them."""
    monkeypatch.chdir(tmp_path)
    first, second = examples()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope: dict = {}
        exec(first.replace('"total_frames=20000"', '"total_frames=2000", "eval.episodes=2"'), scope)
        assert scope["result"].frames == 2000 and scope["result"].best_ckpt.is_file()
        assert (tmp_path / "mlflow.db").is_file() and scope["result"].run_dir.parts[0] == "runs"
        actions = rl_lightning.act(scope["agent"], scope["observations"])
        assert actions.shape == (8,) and set(actions.tolist()) <= {0, 1}
        assert not scope["agent"].training
        exec(second, {})
    printed = out.getvalue()
    assert re.search(r"^return \d+\.0$", printed, re.M)  # the episode the loaded agent played
    assert "SAC RLDataModule" in printed and "FramesProgressBar" in printed
