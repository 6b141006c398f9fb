"""The algorithm protocol: every algorithm implements it, its defaults live once, and the data path
derives the replay from it (a contradicting replay config is one clear line, never a silent fallback)."""

from __future__ import annotations

import importlib
import inspect
import pickle
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

from callbacks._protocol import wrap_hot_path
from rl_lightning.algos.base import TRANSITION_KEYS, ReplayRequirements, RLModule
from rl_lightning.cli import CONF_DIR, compose, experiments, main
from rl_lightning.cli.run import build_module, build_run, env_config
from rl_lightning.data.ingest import Ingestion
from rl_lightning.data.replay import ReplayConfig, ReplayMismatchError, make_replay_buffer, resolve_replay
from rl_lightning.data.transfer import DeviceCopies

ALGO_FILES = sorted((CONF_DIR / "algo").glob("*.yaml"))
#: Constructor arguments that come from the env, not from the config.
FROM_ENV = {"self", "observation_spec", "action_spec"}


def target_class(target: str) -> type:
    module, name = target.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def algo_class(path: Path) -> type:
    return target_class(OmegaConf.load(path)["_target_"])


def test_there_are_algorithm_configs() -> None:
    assert {"dqn", "tdmpc2"} <= {p.stem for p in ALGO_FILES}


@pytest.mark.parametrize("path", ALGO_FILES, ids=lambda p: p.stem)
def test_every_algorithm_is_a_concrete_rl_module(path: Path) -> None:
    cls = algo_class(path)
    assert issubclass(cls, RLModule)
    assert not inspect.isabstract(cls), f"{cls.__name__} lacks {sorted(cls.__abstractmethods__)}"


@pytest.mark.parametrize("path", ALGO_FILES, ids=lambda p: p.stem)
def test_every_update_compiles_as_its_losses(path: Path) -> None:
    """``TorchCompile`` compiles each algorithm's losses, not its whole update (``compile_regions``)."""
    cls = algo_class(path)
    regions = cls.compile_regions.get("update", ())
    assert regions and "update" not in regions
    assert all(callable(getattr(cls, name, None)) for name in regions), regions


def test_a_copy_for_another_process_leaves_the_wrapped_functions_behind() -> None:
    """A collector worker's copy of the module gets the class's methods: the wrappers of the hot paths and
    of the compile regions (compiled functions, CUDA graphs) belong to this process and do not pickle."""
    cfg = compose(["+experiment=dqn_cartpole", "device=cpu"])
    module = build_module(cfg, env_config(cfg))
    for name in ("update", "act", "td_loss"):
        wrap_hot_path(module, name, lambda fn: lambda *args: fn(*args), owner=module)
    copy = pickle.loads(pickle.dumps(module))
    assert not {"update", "act", "td_loss"} & copy.__dict__.keys()
    assert copy.td_loss.__func__ is type(module).td_loss


@pytest.mark.parametrize("path", ALGO_FILES, ids=lambda p: p.stem)
def test_algo_yaml_keys_are_the_constructor_arguments_with_the_same_defaults(path: Path) -> None:
    """Defaults live in the class signature; the YAML lists each of them once, for the CLI and the docs."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    raw.pop("_target_")
    params = {
        name: p for name, p in inspect.signature(algo_class(path)).parameters.items() if name not in FROM_ENV
    }
    assert set(raw) == set(params), (
        f"{path.name}: only in the YAML {sorted(set(raw) - set(params))}, "
        f"only in the signature {sorted(set(params) - set(raw))}"
    )
    for name, value in raw.items():
        if isinstance(value, str) and value.startswith("${"):
            continue  # an interpolation of another group (e.g. num_envs: ${env.num_envs})
        default = params[name].default
        assert default is not inspect.Parameter.empty, f"{name} has no default in the signature"
        if isinstance(default, tuple):
            default = list(default)
        assert value == default, f"{path.name}: {name}={value!r} but the signature's default is {default!r}"


@pytest.mark.parametrize("name", sorted(experiments()))
def test_experiments_state_only_what_differs_from_the_algorithm_defaults(name: str) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml"), resolve=False)
    overrides = raw.get("algo") or {}
    cfg = compose([f"+experiment={name}"])
    params = inspect.signature(target_class(cfg.algo._target_))
    # A preset built on another (its first default) differs from what it inherits, not from the signature.
    parent = next((d for d in raw.get("defaults", []) if isinstance(d, str) and d != "_self_"), None)
    inherited = compose([f"+experiment={parent}"]).algo if parent else {}
    for key, value in overrides.items():
        default = inherited[key] if key in inherited else params.parameters[key].default
        default = list(default) if isinstance(default, tuple) else default
        assert value != default, f"experiment {name} restates the inherited algo.{key}={value!r}"


def _contradictions(needs: ReplayRequirements) -> list[str]:
    """Replay overrides that contradict ``needs``."""
    out = []
    if needs.slice_len is not None:
        out.append(f"replay.slice_len={needs.slice_len + 1}")
    else:
        out.append("replay.slice_len=2")
    if not needs.n_step:
        out.append("replay.n_step=3")
    if not needs.prioritized:
        out.append("replay.prioritized=true")
    return out


@pytest.mark.parametrize("name", sorted(experiments()))
def test_fit_rejects_a_replay_config_that_contradicts_the_algorithm(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run = build_run(compose([f"+experiment={name}", "logger=none", "device=cpu"]))
    needs = run.module.replay_requirements()
    for override in _contradictions(needs):
        assert main(["fit", f"+experiment={name}", "device=cpu", override]) == 2, override
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: replay.") and override.split("=")[0] in err[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_slice_length_follows_the_horizon_when_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = compose(
        ["+experiment=tdmpc2_pendulum", "logger=none", "replay.slice_len=null", "algo.horizon=5",
         "replay.batch_size=100"]
    )  # fmt: skip
    run = build_run(cfg)
    assert run.datamodule.replay_cfg.slice_len == 5
    run.datamodule.setup("fit")
    sampler = run.datamodule.replay.sampler
    assert isinstance(sampler, SliceSampler) and sampler.slice_len == 5


def test_transitions_for_dqn_and_the_n_step_discount_is_the_algorithms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = compose(["+experiment=dqn_cartpole", "logger=none", "algo.gamma=0.9", "replay.n_step=3"])
    run = build_run(cfg)
    run.datamodule.setup("fit")
    assert isinstance(run.datamodule.replay.sampler, RandomSampler)
    assert run.datamodule.ingestion.nstep.n == 3 and run.datamodule.ingestion.nstep.gamma == 0.9


def test_tdmpc2_n_step_discount_is_its_own_discount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = build_run(compose(["+experiment=tdmpc2_pendulum", "logger=none"]))
    needs = run.module.replay_requirements()
    assert needs.discount == pytest.approx(run.module.discount) and needs.discount != 0.99


@pytest.mark.parametrize(
    ("replay", "needs", "message"),
    [
        (ReplayConfig(slice_len=4), ReplayRequirements(slice_len=3), "contradicts"),
        (ReplayConfig(slice_len=4), ReplayRequirements(), "single transitions"),
        (ReplayConfig(n_step=2), ReplayRequirements(slice_len=3), "n-step"),
        (ReplayConfig(prioritized=True), ReplayRequirements(), "prioritized"),
        (ReplayConfig(batch_size=10), ReplayRequirements(slice_len=3), "multiple of"),
    ],
)
def test_resolve_replay_refuses_contradictions(
    replay: ReplayConfig, needs: ReplayRequirements, message: str
) -> None:
    with pytest.raises(ReplayMismatchError, match=message):
        resolve_replay(replay, needs, "ALGO")


def test_resolve_replay_completes_and_keeps_what_fits() -> None:
    assert resolve_replay(ReplayConfig(batch_size=96), ReplayRequirements(slice_len=3), "A").slice_len == 3
    cfg = ReplayConfig(n_step=3, prioritized=True)
    assert resolve_replay(cfg, ReplayRequirements(discount=0.9, n_step=True, prioritized=True), "A") == cfg


def test_requirements_refuse_inconsistent_declarations() -> None:
    with pytest.raises(ValueError, match="discount"):
        ReplayRequirements(n_step=True)
    with pytest.raises(ValueError, match="sub-trajectory"):
        ReplayRequirements(slice_len=3, prioritized=True)
    with pytest.raises(ValueError, match="sample_keys"):
        ReplayRequirements(slice_len=3, sample_keys=TRANSITION_KEYS)


def test_the_replay_stores_only_the_keys_the_update_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    overrides = ["logger=none", "device=cpu", "progress_bar=false", "eval.every_frames=0", "eval.episodes=1"]
    overrides += ["total_frames=300", "collect.warmup_frames=100"]
    run = build_run(compose(["+experiment=dqn_cartpole", *overrides]))
    run.trainer.fit(run.module, datamodule=run.datamodule)
    stored = run.datamodule.replay.storage[: len(run.datamodule.replay)]
    assert len(stored) == 300
    # Done flags, episode counters and the rest of what the collector writes are left out (TorchRL's buffer
    # adds each row's index).
    assert set(stored.keys(True, True)) == {*TRANSITION_KEYS, "index"}


def test_a_sample_key_the_collected_data_lacks_stops_with_its_name() -> None:
    needs = ReplayRequirements(sample_keys=(*TRANSITION_KEYS, ("next", "winner")))
    cpu = torch.device("cpu")
    ingestion = Ingestion(needs, None, DeviceCopies(cpu, cpu))
    replay = make_replay_buffer(ReplayConfig(device="cpu"))
    flag = torch.zeros(1, 2, 1, dtype=torch.bool)
    batch = TensorDict(
        {
            "observation": torch.zeros(1, 2, 4),
            "action": torch.zeros(1, 2, dtype=torch.long),
            "next": {"observation": torch.zeros(1, 2, 4), "reward": torch.zeros(1, 2, 1), "terminated": flag},
        },
        batch_size=[1, 2],
    )
    batch["next", "done"] = flag
    with pytest.raises(KeyError, match=r"sample_keys name \[\('next', 'winner'\)\]"):
        ingestion.ingest(batch, replay, frames=0)
