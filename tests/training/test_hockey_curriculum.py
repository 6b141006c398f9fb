"""HockeyCurriculum: stage switches by frames and by win rate, what the training envs then play, the
self-play pool (weights, frozen snapshots, discrete agents), checkpoint round trips, config errors, and one
run through the real CLI."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from helpers.cli import run_main
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos.dqn import DQN
from rl_lightning.algos.sac import SAC
from rl_lightning.cli import main
from rl_lightning.data.collection import Collection
from rl_lightning.data.datamodule import CollectConfig, RLDataModule
from rl_lightning.data.replay import ReplayConfig
from rl_lightning.envs.factory import EnvConfig, make_env
from rl_lightning.envs.hockey import DISCRETE_ACTIONS, HockeyVsOpponentEnv, Mode, PolicyOpponent
from rl_lightning.training.checkpoint import FrameCheckpoint
from rl_lightning.training.hockey_curriculum import HockeyCurriculum

HOCKEY = EnvConfig(
    id="HockeyVsOpponent-v0", num_envs=2, kwargs={"mode": "NORMAL", "opponent": "weak"}, info_keys=("winner",)
)
STAGES = [
    {"name": "shooting", "mode": "TRAIN_SHOOTING", "opponent": "weak", "frames": 100},
    {"name": "defence", "mode": "TRAIN_DEFENSE", "opponent": "strong", "frames": 50},
    {"name": "weak", "mode": "NORMAL", "opponent": "weak", "win_rate": 0.5, "against": "weak"},
    {"name": "self-play", "mode": "NORMAL", "opponent": {"weak": 0.3, "strong": 0.4, "self": 0.3}},
]


def sac(seed: int = 0) -> SAC:
    torch.manual_seed(seed)
    obs = Composite(observation=Unbounded((1, 18)), shape=(1,))
    return SAC(obs, Bounded(-torch.ones(1, 4), torch.ones(1, 4), shape=(1, 4)), hidden_sizes=(32, 32))


def sac_batch(n: int = 32) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    done = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict(
        {
            "observation": torch.randn(n, 18, generator=g),
            "action": torch.rand(n, 4, generator=g) * 2 - 1,
            "next": {
                "observation": torch.randn(n, 18, generator=g),
                "reward": torch.randn(n, 1, generator=g),
                "terminated": done,
                "truncated": done.clone(),
                "done": done.clone(),
            },
        },
        batch_size=[n],
    )


class Recorder:
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((step, dict(metrics)))

    def stages(self) -> list[tuple[int, float]]:
        return [(s, m["curriculum/stage"]) for s, m in self.logged if "curriculum/stage" in m]


def setting(env_cfg: EnvConfig = HOCKEY, workers: int = 0, module: Any = None) -> SimpleNamespace:
    """A trainer stand-in over the real data module, with a live training env (as a collector has)."""
    module = module if module is not None else sac()
    dm = RLDataModule(
        env_cfg,
        ReplayConfig(device="cpu"),
        CollectConfig(total_frames=10_000, frames_per_batch=16, warmup_frames=32, workers=workers),
        module,
    )
    logger = Recorder()
    trainer = SimpleNamespace(
        datamodule=dm, callback_metrics={}, loggers=[logger], global_step=0, lightning_module=module
    )
    dm.trainer = trainer
    return SimpleNamespace(trainer=trainer, dm=dm, module=module, logger=logger)


def start(curriculum: HockeyCurriculum, s: SimpleNamespace, live_env: bool = True) -> None:
    curriculum.connect_training_envs(s.dm.training_envs)  # as the run's wiring does
    curriculum.setup(s.trainer, s.module, "fit")
    if live_env:
        s.dm.collection = Collection(collector=None, env=make_env(s.dm.env_cfg, seed=0))
    curriculum.on_fit_start(s.trainer, s.module)


def at(curriculum: HockeyCurriculum, s: SimpleNamespace, frames: int) -> int:
    s.dm.budget.frames = frames
    curriculum.on_train_batch_end(s.trainer, s.module, None, None, 0)
    return curriculum.stage


def played(env: Any) -> list[tuple[Mode, str]]:
    """Each training env's (mode, opponent) after a reset of all of them."""
    env.reset()
    return [(e.unwrapped.mode, e.unwrapped.opponent_name) for e in env.envs]


# ------------------------------------------------------------------------------------------ the env
def test_set_curriculum_takes_effect_at_the_next_reset() -> None:
    env = HockeyVsOpponentEnv(opponent="weak")
    env.reset(seed=0)
    env.set_curriculum(mode="TRAIN_DEFENSE", opponent="strong")
    assert (env.mode, env.opponent_name) == (Mode.NORMAL, "weak"), "the episode under way is left alone"
    env.reset()
    assert (env.mode, env.opponent_name, env.max_timesteps) == (Mode.TRAIN_DEFENSE, "strong", 80)
    env.set_curriculum(mode={"NORMAL": 1, "TRAIN_SHOOTING": 1})
    modes = {(env.reset(), env.mode)[1] for _ in range(50)}
    assert modes == {Mode.NORMAL, Mode.TRAIN_SHOOTING} and env.opponent_name == "strong"
    for bad in ({"opponent": "medium"}, {"opponent": {"weak": 1, "self_0": 1}}, {"mode": "FAST"}):
        with pytest.raises(ValueError):
            env.set_curriculum(**bad)
    env.reset()
    assert env.opponent_name == "strong", "a refused setting changes nothing"


def test_a_fixed_mode_or_opponent_draws_nothing_from_the_env_generator() -> None:
    # Setting what a plain env plays gives the same episodes as building it that way.
    plain = HockeyVsOpponentEnv(opponent="strong", mode="TRAIN_SHOOTING")
    switched = HockeyVsOpponentEnv()
    switched.set_curriculum(mode="TRAIN_SHOOTING", opponent="strong")
    for env in (plain, switched):
        env.reset(seed=3)
    for _ in range(3):
        np.testing.assert_array_equal(plain.reset()[0], switched.reset()[0])


# ------------------------------------------------------------------------------------------ switching
def test_stages_switch_by_frames_and_the_envs_play_the_new_stage() -> None:
    s = setting()
    curriculum = HockeyCurriculum(STAGES)
    start(curriculum, s)
    env = s.dm.training_env
    try:
        assert played(env) == [(Mode.TRAIN_SHOOTING, "weak")] * 2
        assert [at(curriculum, s, f) for f in (50, 99)] == [0, 0]
        assert at(curriculum, s, 100) == 1
        assert played(env) == [(Mode.TRAIN_DEFENSE, "strong")] * 2
        # Frames count from the stage's start (100), not from the run's.
        assert [at(curriculum, s, f) for f in (120, 149, 150)] == [1, 1, 2]
        assert played(env) == [(Mode.NORMAL, "weak")] * 2
        # A stage that waits for a win rate stays without an evaluation.
        assert at(curriculum, s, 5000) == 2
    finally:
        env.close()
    assert s.logger.stages() == [(0, 0.0), (100, 1.0), (150, 2.0)]


def test_a_switch_waits_for_a_new_evaluation_that_reaches_the_win_rate() -> None:
    s = setting()
    stages = [
        {"name": "drill", "mode": "TRAIN_SHOOTING", "frames": 10},
        {"name": "weak", "opponent": "weak", "win_rate": 0.5, "against": "weak"},
        {"name": "strong", "opponent": "strong"},
    ]
    curriculum = HockeyCurriculum(stages)
    metrics = s.trainer.callback_metrics
    metrics["eval/weak/win_rate"] = torch.tensor(0.9)  # an evaluation from before the stage
    metrics["eval/win_rate"] = torch.tensor(0.9)
    start(curriculum, s)
    try:
        assert at(curriculum, s, 10) == 1
        assert at(curriculum, s, 20) == 1, "an evaluation made before the stage began must not end it"
        metrics["eval/weak/win_rate"] = torch.tensor(0.4)
        assert at(curriculum, s, 30) == 1
        metrics["eval/weak/win_rate"] = torch.tensor(0.5)
        assert at(curriculum, s, 40) == 2
        assert played(s.dm.training_env) == [(Mode.NORMAL, "strong")] * 2
    finally:
        s.dm.training_env.close()


def test_a_win_rate_the_evaluation_does_not_log_is_one_clear_error() -> None:
    s = setting()
    curriculum = HockeyCurriculum(
        [{"opponent": "weak", "win_rate": 0.5, "against": "strong"}, {"opponent": "strong"}]
    )
    start(curriculum, s, live_env=False)
    s.trainer.callback_metrics.update(
        {"eval/weak/win_rate": torch.tensor(0.0), "eval/win_rate": torch.tensor(0.0)}
    )
    with pytest.raises(ValueError, match=r"eval/strong/win_rate.*eval\.variants") as err:
        at(curriculum, s, 100)
    assert "\n" not in str(err.value)


def test_envs_built_after_the_switch_start_in_the_current_stage() -> None:
    # The collector's envs are built after on_fit_start: the stage reaches them before their first reset.
    s = setting()
    curriculum = HockeyCurriculum(STAGES)
    start(curriculum, s, live_env=False)
    s.dm.budget.frames = 0
    collector = s.dm.start_collection().collector
    try:
        next(iter(collector))
        assert [(e.unwrapped.mode, e.unwrapped.opponent_name) for e in s.dm.training_env.envs] == [
            (Mode.TRAIN_SHOOTING, "weak")
        ] * 2
        at(curriculum, s, 100)
        assert played(s.dm.training_env) == [(Mode.TRAIN_DEFENSE, "strong")] * 2
    finally:
        s.dm.close_collector()
    assert s.dm.training_env is None


@pytest.mark.slow
def test_async_vectorized_envs_follow_the_switch() -> None:
    s = setting(EnvConfig(**{**vars(HOCKEY), "vectorization": "async"}))
    curriculum = HockeyCurriculum(STAGES)
    start(curriculum, s)
    vec = s.dm.training_env._vec
    try:
        s.dm.training_env.reset()
        assert vec.get_attr("opponent_name") == ("weak", "weak")
        assert at(curriculum, s, 100) == 1
        s.dm.training_env.reset()
        assert [Mode(m) for m in vec.get_attr("mode")] == [Mode.TRAIN_DEFENSE] * 2
        assert vec.get_attr("opponent_name") == ("strong", "strong")
    finally:
        s.dm.training_env.close()


# ------------------------------------------------------------------------------------------ self-play
def test_self_play_pool_snapshots_and_weights() -> None:
    s = setting()
    curriculum = HockeyCurriculum(STAGES[3:], snapshot_every_frames=100, pool_size=3)
    start(curriculum, s)
    try:
        assert [p.frames for p in curriculum.pool] == [0]  # the agent joins on entering the stage
        for frames in (50, 100, 150, 200, 300):
            at(curriculum, s, frames)
        assert [p.frames for p in curriculum.pool] == [100, 200, 300]  # the newest pool_size
        assert [p.name for p in curriculum.pool] == ["self_1", "self_2", "self_3"]
        mix = curriculum.opponent_mix()
        assert mix == pytest.approx({"weak": 0.3, "strong": 0.4, "self_1": 0.1, "self_2": 0.1, "self_3": 0.1})
        names = [name for _, name in played(s.dm.training_env)]
        assert set(names) <= set(mix)
    finally:
        s.dm.training_env.close()
    pools = [m["curriculum/pool_size"] for _, m in s.logger.logged if "curriculum/pool_size" in m]
    assert pools == [1, 2, 3, 3]


def test_the_pool_is_drawn_by_its_weights() -> None:
    curriculum = HockeyCurriculum(STAGES[3:], pool_size=3)
    module = sac()
    for frames in (0, 1, 2):
        curriculum._snapshot(module, frames)
    mix = curriculum.opponent_mix()
    env = HockeyVsOpponentEnv()
    env.set_curriculum(opponent=mix, policies={p.name: p.policy for p in curriculum.pool})
    env.reset(seed=123)
    n = 4000
    names = [(env.reset(), env.opponent_name)[1] for _ in range(n)]
    freq = {name: names.count(name) / n for name in mix}
    assert freq == pytest.approx(mix, abs=0.025)
    # The drawn snapshot plays: its policy answers player 2's observation.
    while env.opponent_name == "weak" or env.opponent_name == "strong":
        env.reset()
    assert isinstance(env.opponent, PolicyOpponent)
    env.step(np.zeros(4, dtype=np.float32))


def test_frozen_opponents_do_not_train() -> None:
    module = sac()
    curriculum = HockeyCurriculum(STAGES[3:])
    curriculum._snapshot(module, 0)
    frozen = curriculum.pool[0].policy
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    actor_before = [p.detach().clone() for p in module.actor_net.parameters()]
    assert not frozen.training and all(not p.requires_grad for p in frozen.parameters())
    assert all(p.device.type == "cpu" for p in frozen.parameters())
    live = {p.data_ptr() for p in module.parameters()}
    assert not any(p.data_ptr() in live for p in frozen.parameters()), "a snapshot must own its weights"
    for _ in range(5):
        module.update(sac_batch())
    assert any(not torch.equal(a, p) for a, p in zip(actor_before, module.actor_net.parameters()))
    for k, v in frozen.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in frozen.parameters())


def test_snapshot_opponents_act_in_the_continuous_hockey_format() -> None:
    opponent = PolicyOpponent(sac().export_policy().eval())
    action = opponent(np.zeros(18, dtype=np.float32))
    assert action.shape == (4,) and action.dtype == np.float32 and np.all(np.abs(action) <= 1)
    # A discrete agent's code becomes the code's continuous action.
    torch.manual_seed(0)
    obs = Composite(observation=Unbounded((1, 18)), shape=(1,))
    dqn = DQN(obs, Categorical(8, shape=(1,)), hidden_sizes=(16,))
    code = int(dqn.export_policy()(torch.zeros(1, 18)))
    np.testing.assert_array_equal(PolicyOpponent(dqn.export_policy())(np.zeros(18)), DISCRETE_ACTIONS[code])


def test_discrete_hockey_plays_against_a_discrete_snapshot() -> None:
    torch.manual_seed(0)
    obs = Composite(observation=Unbounded((1, 18)), shape=(1,))
    dqn = DQN(obs, Categorical(8, shape=(1,)), hidden_sizes=(16,))
    cfg = EnvConfig(**{**vars(HOCKEY), "id": "HockeyVsOpponentDiscrete-v0"})
    s = setting(cfg, module=dqn)
    curriculum = HockeyCurriculum([{"opponent": "self"}])
    start(curriculum, s)
    env = s.dm.training_env
    try:
        assert played(env) == [(Mode.NORMAL, "self_0")] * 2
        td = env.rand_step(env.reset())
        assert td["next", "observation"].shape == (2, 18)
    finally:
        env.close()


# ------------------------------------------------------------------------------------------ checkpoints
def test_state_dict_round_trip_restores_stage_and_pool() -> None:
    s = setting()
    curriculum = HockeyCurriculum(STAGES, snapshot_every_frames=100, pool_size=2)
    start(curriculum, s)
    s.dm.training_env.close()
    at(curriculum, s, 100)
    at(curriculum, s, 150)
    s.trainer.callback_metrics["eval/weak/win_rate"] = torch.tensor(0.75)
    assert at(curriculum, s, 200) == 3
    s.module.update(sac_batch())  # the agent moves on: the snapshots keep the weights they were taken with
    at(curriculum, s, 300)
    buffer = io.BytesIO()
    torch.save(curriculum.state_dict(), buffer)  # checkpoints load with weights_only=True
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    resumed_setting = setting(module=sac(seed=1))
    resumed = HockeyCurriculum(STAGES, snapshot_every_frames=100, pool_size=2)
    resumed.load_state_dict(state)
    resumed_setting.dm.budget.frames = 300
    start(resumed, resumed_setting)
    try:
        assert resumed.stage == 3 and resumed.stage_start_frames == 200
        assert [(p.id, p.frames) for p in resumed.pool] == [(p.id, p.frames) for p in curriculum.pool]
        for old, new in zip(curriculum.pool, resumed.pool):
            for (k, a), b in zip(old.policy.state_dict().items(), new.policy.state_dict().values()):
                assert torch.equal(a, b), k
            assert not new.policy.training and not any(p.requires_grad for p in new.policy.parameters())
        assert {name for _, name in played(resumed_setting.dm.training_env)} <= {
            "weak", "strong", "self_1", "self_2"
        }  # fmt: skip
        # The resumed run keeps to the snapshot schedule.
        at(resumed, resumed_setting, 399)
        assert len(resumed.pool) == 2 and resumed.pool[-1].frames == 300
        at(resumed, resumed_setting, 400)
        assert resumed.pool[-1].frames == 400
    finally:
        resumed_setting.dm.training_env.close()
    assert resumed_setting.logger.stages()[0] == (300, 3.0)
    fewer = HockeyCurriculum(STAGES[:2])
    with pytest.raises(ValueError, match=r"stage 3 .* has 2 stages"):
        fewer.load_state_dict(state)


def test_a_checkpoint_in_the_batch_of_a_decisive_evaluation_holds_the_next_stage() -> None:
    # Lightning runs the checkpoint callback after every other one, the curriculum included, whatever
    # order they were given in; the evaluation (given first, as fit does) runs before the curriculum.
    s = setting()
    curriculum = HockeyCurriculum(STAGES[2:])
    checkpoint = FrameCheckpoint(Path("unused"), every_frames=100)
    trainer = L.Trainer(callbacks=[checkpoint, curriculum], logger=False, enable_progress_bar=False)
    assert trainer.callbacks.index(curriculum) < trainer.callbacks.index(checkpoint)
    start(curriculum, s, live_env=False)
    s.dm.budget.frames = 500
    s.trainer.callback_metrics["eval/weak/win_rate"] = torch.tensor(0.6)
    assert curriculum.state_dict()["stage"] == 0, "state_dict only reads"
    curriculum.on_train_batch_end(s.trainer, s.module, None, None, 0)  # then the checkpoint's
    assert curriculum.state_dict()["stage"] == 1


def test_state_dict_has_no_side_effect() -> None:
    # A stage's frames are spent and a snapshot is due: reading the state twice changes neither.
    s = setting()
    curriculum = HockeyCurriculum(STAGES, snapshot_every_frames=100)
    start(curriculum, s, live_env=False)
    s.dm.budget.frames = 100
    first = curriculum.state_dict()
    assert curriculum.state_dict() == first and first["stage"] == 0 and curriculum.stage == 0
    assert s.logger.stages() == [(0, 0.0)], "nothing logged, nothing applied"


def test_the_marks_end_a_batch_at_the_stage_end_and_at_each_snapshot() -> None:
    s = setting()
    curriculum = HockeyCurriculum(STAGES, snapshot_every_frames=100)
    start(curriculum, s, live_env=False)
    budget = s.dm.budget
    budget.frames = 99
    assert not budget.batch_end_due()
    budget.frames = 100  # the shooting stage's 100 frames
    assert budget.batch_end_due()
    assert at(curriculum, s, 100) == 1 and not budget.batch_end_due()
    budget.frames = 150  # the defence stage's 50
    assert budget.batch_end_due()
    at(curriculum, s, 150)
    s.trainer.callback_metrics["eval/weak/win_rate"] = torch.tensor(0.75)
    assert at(curriculum, s, 160) == 3 and curriculum.pool[-1].frames == 160
    budget.frames = 259
    assert not budget.batch_end_due()
    budget.frames = 260  # the next snapshot, 100 frames after the last
    assert budget.batch_end_due()


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stages": []}, "non-empty list"),
        ({"stages": {"name": "a"}}, "non-empty list"),
        ({"stages": ["weak"]}, "each stage is a mapping"),
        ({"stages": [{"mode": "SHOOTING"}]}, "unknown mode 'SHOOTING'"),
        ({"stages": [{"opponent": "medium"}]}, "unknown opponent 'medium'"),
        ({"stages": [{"opponent": {"weak": -1}}]}, "finite and >= 0"),
        ({"stages": [{"opponent": {"weak": 0}}]}, "needs a positive weight"),
        ({"stages": [{"frames": 0}]}, "frames=0 must be an int >= 1"),
        ({"stages": [{"win_rate": 1.5}]}, r"win_rate=1.5 must be a number in \(0, 1\]"),
        ({"stages": [{"against": "weak"}]}, "needs a win_rate"),
        ({"stages": [{"name": "a"}, {"name": "b"}]}, r"stage 0 \(a\) never ends"),
        ({"stages": [{"modes": "NORMAL"}]}, r"unknown keys \['modes'\]"),
        ({"stages": STAGES, "snapshot_every_frames": 0}, "snapshot_every_frames=0 must be an int >= 1"),
        ({"stages": STAGES, "pool_size": 2.5}, "pool_size=2.5 must be an int >= 1"),
    ],
)
def test_bad_configs_raise_one_clear_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        HockeyCurriculum(**kwargs)
    assert str(err.value).startswith("HockeyCurriculum: ") and "\n" not in str(err.value)


def test_the_cli_prints_a_bad_stage_as_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["fit", "+experiment=sac_hockey_curriculum", "logger=none", "device=cpu"]
    assert main([*args, "callbacks.hockey_curriculum.stages=[{mode: SHOOT}]"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: HockeyCurriculum: stage 0") and "unknown mode 'SHOOT'" in err
    assert "\n" not in err and not (tmp_path / "runs").exists()


def test_multi_process_collectors_are_refused_in_one_line() -> None:
    s = setting(workers=2)
    with pytest.raises(ValueError, match=r"collect\.workers=2.*set collect\.workers=0") as err:
        start(HockeyCurriculum(STAGES), s, live_env=False)
    assert "\n" not in str(err.value)


def test_an_env_without_a_curriculum_is_refused() -> None:
    s = setting(EnvConfig(id="Pendulum-v1"))
    with pytest.raises(ValueError, match="no set_curriculum"):
        start(HockeyCurriculum(STAGES), s, live_env=False)


def test_self_play_needs_an_exportable_policy() -> None:
    s = setting()

    class Planner(SAC):
        def export_policy(self) -> torch.nn.Module:
            raise NotImplementedError("it plans")

    torch.manual_seed(0)
    module = Planner(
        Composite(observation=Unbounded((1, 18)), shape=(1,)),
        Bounded(-torch.ones(1, 4), torch.ones(1, 4), shape=(1, 4)),
        hidden_sizes=(8,),
    )
    with pytest.raises(ValueError, match=r"snapshot_policy.*it plans"):
        HockeyCurriculum(STAGES, envs=s.dm.training_envs).setup(s.trainer, module, "fit")
    HockeyCurriculum(STAGES[:3], envs=s.dm.training_envs).setup(s.trainer, module, "fit")  # no self-play


# ------------------------------------------------------------------------------------------ the CLI
@pytest.mark.slow
def test_cli_run_through_the_curriculum_into_self_play(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    stage_frames = [f"callbacks.hockey_curriculum.stages.{i}.frames=100" for i in range(4)]
    args = [
        "fit",
        "+experiment=sac_hockey_curriculum",
        "+debug=quick",
        "device=cpu",
        *stage_frames,
        "callbacks.hockey_curriculum.snapshot_every_frames=100",
    ]
    proc = run_main(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # In this process the notices go to the logging capture rather than to the streams.
    said = proc.stdout + proc.stderr + caplog.text
    switches = re.findall(r"curriculum: stage (\d) \((.+?)\) at (\d+) frames", said)
    assert [(int(i), name) for i, name, _ in switches] == [
        (1, "defence"), (2, "weak"), (3, "weak+strong"), (4, "self-play")
    ]  # fmt: skip
    # Each stage ends at the first collection (16 frames) that completes its 100 frames: collections share a
    # batch only until the curriculum is due, so the stage ends at that batch's end.
    assert [int(frames) for *_, frames in switches] == [112, 224, 336, 448]
    (ckpt,) = tmp_path.glob("runs/debug/sac_hockey_curriculum/*/checkpoints/last.ckpt")
    state = torch.load(ckpt, weights_only=True)["callbacks"]["HockeyCurriculum"]
    assert state["stage"] == 4 and len(state["pool"]) >= 1
