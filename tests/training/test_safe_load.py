"""Loading a shared checkpoint never runs code: crafted files are refused with one line and no side effect;
real checkpoints, including those of the previous format, load, evaluate and resume."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from rl_lightning.cli import main
from rl_lightning.data.safety import UnsafeFileError, check_replay_dir
from rl_lightning.training.safe_load import CONFIG_KEY, FORMAT_VERSION, check_targets, load_checkpoint

LEGACY = Path(__file__).resolve().parents[1] / "fixtures" / "legacy"
MARKER = "pwned_marker"

QUICK = [
    "+experiment=dqn_cartpole",
    "device=cpu",
    "logger=none",
    "progress_bar=false",
    "total_frames=300",
    "collect.frames_per_batch=50",
    "collect.warmup_frames=100",
    "eval.every_frames=0",
    "eval.episodes=1",
    "checkpoint.every_frames=100",
    "algo.hidden_sizes=[16,16]",
]


class Payload:
    """Unpickling this runs a shell command that creates the marker file."""

    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def real_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> Path:
    """A short real DQN run in ``tmp_path``; returns its last.ckpt."""
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *QUICK]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return tmp_path / out["last_ckpt"]


def test_a_pickle_payload_checkpoint_is_refused_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    torch.save({"state_dict": {}, CONFIG_KEY: {"config": {}}, "x": Payload()}, "shared_agent.ckpt")
    assert main(["evaluate", "ckpt=shared_agent.ckpt"]) == 2
    assert "holds Python objects that loading would have to run" in one_error_line(capsys)
    # The resume path refuses it too (it is checked before Lightning loads it).
    assert main(["fit", *QUICK, "ckpt_path=shared_agent.ckpt"]) == 2
    assert "holds Python objects" in one_error_line(capsys)
    assert not (tmp_path / MARKER).exists()


@pytest.mark.parametrize(
    "where",
    [
        ("algo", "_target_"),  # the algorithm itself
        ("algo", "hidden_sizes"),  # a nested node that Hydra would instantiate recursively
        ("callbacks", "evil"),  # a callback
    ],
)
def test_a_config_naming_foreign_code_is_refused_before_instantiation(
    where: tuple[str, str], real_run: Path, capsys
) -> None:
    ckpt = torch.load(real_run, weights_only=True)
    config = ckpt[CONFIG_KEY]["config"]
    group, key = where
    bad = {"_target_": "os.system", "_args_": [f"touch {MARKER}"]}
    if key == "_target_":
        config[group] = {**config[group], **bad}
    else:
        config.setdefault(group, {})
        config[group] = {**(config[group] or {}), key: bad}
    crafted = real_run.with_name("crafted.ckpt")
    torch.save(ckpt, crafted)
    assert main(["evaluate", f"ckpt={crafted}"]) == 2
    line = one_error_line(capsys)
    assert "'os.system' is not one of rl_lightning's algorithms or callbacks" in line
    assert not (real_run.parents[3] / MARKER).exists() and not Path(MARKER).exists()


def test_check_targets_accepts_the_projects_own_and_refuses_lookalikes() -> None:
    check_targets({"algo": {"_target_": "rl_lightning.algos.dqn.DQN"}})
    check_targets({"callbacks": {"c": {"_target_": "callbacks.ThroughputMonitor"}}})
    for target in (
        "rl_lightning.algos.common.polyak_update",  # in the package, but no algorithm
        "rl_lightning.cli.main",
        "callbacks._protocol.wrap_hot_path",
        "rl_lightning_evil.algos.X",
        "os.system",
    ):
        with pytest.raises(UnsafeFileError, match="not one of"):
            check_targets({"algo": {"_target_": target}})


@pytest.mark.parametrize("crafted", ["prefetch.pkl", "meta.json", "extra_file"])
def test_a_crafted_replay_directory_is_refused_on_resume(
    crafted: str, real_run: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    replay = Path(str(real_run) + ".replay")
    if crafted == "prefetch.pkl":
        (replay / "prefetch.pkl").write_bytes(pickle.dumps(Payload()))
    elif crafted == "meta.json":
        meta = json.loads((replay / "storage" / "meta.json").read_text())
        meta["_type"] = "<class 'evil.module.Tensorclass'>"
        (replay / "storage" / "meta.json").write_text(json.dumps(meta))
    else:
        (replay / "storage" / "payload.so").write_bytes(b"\x7fELF")
    assert main(["fit", *QUICK, "total_frames=400", "ckpt_path=last"]) == 2
    line = one_error_line(capsys)
    assert "replay directory" in line and "refusing to load it" in line
    assert not Path(MARKER).exists()
    # And the checkpoint it sits beside was not overwritten by the failed resume.
    assert torch.load(real_run, weights_only=True)["global_step"] > 0


def test_the_replay_check_accepts_what_fit_writes(real_run: Path) -> None:
    check_replay_dir(Path(str(real_run) + ".replay"))


@pytest.mark.parametrize("name", ["dqn", "tdmpc2"])
@pytest.mark.slow
def test_checkpoints_of_the_previous_format_evaluate_and_resume(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Runs written before the algorithm protocol (format 1): renamed state entries, an algo key moved."""
    run = tmp_path / "runs" / f"legacy_{name}" / "20260101-000000"
    shutil.copytree(LEGACY / name, run)
    last = run / "checkpoints" / "last.ckpt"
    raw = torch.load(last, weights_only=True)
    assert "format" not in raw[CONFIG_KEY]  # really the old format
    ckpt = load_checkpoint(last)
    assert ckpt[CONFIG_KEY]["format"] == FORMAT_VERSION
    assert "log_every_n_updates" not in ckpt[CONFIG_KEY]["config"]["algo"]
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", f"ckpt={last}", "episodes=1", "logger=none"]) == 0
    capsys.readouterr()
    experiment = {"dqn": "dqn_cartpole", "tdmpc2": "tdmpc2_pendulum"}[name]
    saved = ckpt[CONFIG_KEY]["config"]
    frames = next(v for k, v in raw.items() if k.endswith("RLDataModule"))["frames"]
    algo = [f"algo.{k}={json.dumps(v)}" for k, v in saved["algo"].items() if k != "_target_"]
    resume = [
        f"+experiment={experiment}", f"name=legacy_{name}", "device=cpu", "logger=none", "progress_bar=false",
        f"total_frames={frames + 50}", f"replay.capacity={saved['replay']['capacity']}",
        f"replay.batch_size={saved['replay']['batch_size']}", f"collect.warmup_frames={frames}",
        "eval.episodes=1", "eval.every_frames=0", *algo, "ckpt_path=last",
    ]  # fmt: skip
    assert main(["fit", *resume]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["frames"] == frames + 50 and out["run_dir"] == str(run.relative_to(tmp_path))


def test_a_checkpoint_of_a_newer_format_says_what_to_do(real_run: Path, capsys) -> None:
    ckpt = torch.load(real_run, weights_only=True)
    ckpt[CONFIG_KEY]["format"] = FORMAT_VERSION + 1
    newer = real_run.with_name("newer.ckpt")
    torch.save(ckpt, newer)
    assert main(["evaluate", f"ckpt={newer}"]) == 2
    assert "written by a newer rl_lightning" in one_error_line(capsys)
