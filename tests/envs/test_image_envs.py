"""Image observations end to end: the envs' protocols, the encoders, and every Atari and MinAtar experiment
through the real CLI (fit, resume, evaluate with a video)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Unbounded

from rl_lightning.cli import experiments, main
from rl_lightning.envs.factory import EnvConfig, check_env_id, make_env
from rl_lightning.envs.images import AtariFrames, MissingExtraError, area_weights
from rl_lightning.envs.vector import GymVecEnv
from rl_lightning.nn.encoders import FlatEncoder, ImageEncoder, make_encoder

pytest.importorskip("ale_py")
pytest.importorskip("minatar")

IMAGE_EXPERIMENTS = sorted(e for e in experiments() if e.endswith(("_minatar", "_atari", "_atari_cpu")))
#: The GPU-sized Atari presets differ from their CPU variants only in sizes (which test_config.py composes):
#: one of them runs, with its 1M-transition replay and 8 envs.
SMOKED = [e for e in IMAGE_EXPERIMENTS if not e.endswith("_atari") or e == "dqn_atari"]
ATARI = EnvConfig(
    id="ALE/Breakout-v5", preprocess="atari", frame_stack=4, kwargs={"repeat_action_probability": 0.25}
)


def test_every_dqn_family_member_has_minatar_and_atari_experiments():
    assert {"dqn_minatar", "qrdqn_minatar", "iqn_minatar", "rainbow_minatar"} <= set(IMAGE_EXPERIMENTS)
    for name in ("dqn_atari", "iqn_atari", "rainbow_atari"):
        assert {name, f"{name}_cpu"} <= set(IMAGE_EXPERIMENTS)


def test_atari_frames_follow_the_protocol():
    env = make_env(ATARI, num_envs=2, seed=0)
    spec = env.observation_spec["observation"]
    assert isinstance(spec, Bounded) and spec.dtype == torch.uint8 and spec.shape == (2, 4, 84, 84)
    assert int(spec.space.high.max()) == 255
    (single,) = {type(e.unwrapped).__name__ for e in env.envs}
    assert single == "AtariEnv"
    base = env.envs[0].unwrapped
    assert base._frameskip == 1  # AtariFrames repeats the action (4 frames) and max-pools
    assert base.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    wrapper = env.envs[0]
    while not isinstance(wrapper, AtariFrames):
        wrapper = wrapper.env
    assert wrapper.frame_skip == 4
    td = env.reset()
    obs = td.get("observation")
    assert obs.dtype == torch.uint8
    assert torch.equal(obs[:, 0], obs[:, 3])  # the first observation of an episode is its frame repeated
    env.close()


@pytest.mark.parametrize("game", ["ALE/Breakout-v5", "ALE/SpaceInvaders-v5"])
@pytest.mark.slow
def test_atari_frames_are_gymnasiums_atari_preprocessing_to_rounding(game: str):
    """The same steps through AtariFrames and gymnasium's AtariPreprocessing (OpenCV's area resize), with
    noop_max=0 and episodes to game over: the same rewards and ends, frames within 1 of 255 on a pixel."""
    pytest.importorskip("cv2")
    kwargs = {"frameskip": 1, "repeat_action_probability": 0.25}
    ours = AtariFrames(gym.make(game, **kwargs))
    theirs = gym.wrappers.AtariPreprocessing(
        gym.make(game, **kwargs), noop_max=0, terminal_on_life_loss=False
    )
    a, _ = ours.reset(seed=3)
    b, _ = theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    gaps, ends = [np.abs(a.astype(int) - b)], 0
    for _ in range(400):
        action = int(rng.integers(ours.action_space.n))
        a, reward_a, term_a, trunc_a, _ = ours.step(action)
        b, reward_b, term_b, trunc_b, _ = theirs.step(action)
        assert (reward_a, term_a, trunc_a) == (reward_b, term_b, trunc_b)
        gaps.append(np.abs(a.astype(int) - b))
        if term_a or trunc_a:
            ends += 1
            a, _ = ours.reset()
            b, _ = theirs.reset()
    gaps = np.stack(gaps)
    assert gaps.max() <= 1 and (gaps > 0).mean() < 1e-3
    assert a.shape == (84, 84) and a.dtype == np.uint8


def test_the_area_resize_averages_each_output_over_its_share_of_the_input():
    weights = area_weights(210, 84)  # 2.5 input rows per output row
    assert np.allclose(weights.sum(1), 1.0)
    assert np.allclose(weights[0, :3], [0.4, 0.4, 0.2]) and not weights[0, 3:].any()
    assert np.allclose(weights[1, 2:5], [0.2, 0.4, 0.4])
    assert np.allclose(area_weights(6, 3), np.kron(np.eye(3), [0.5, 0.5]))  # an integer ratio: plain means


def test_minatar_grids_are_channels_first_uint8():
    env = make_env(EnvConfig(id="MinAtar/SpaceInvaders-v1", preprocess="minatar"), num_envs=1, seed=0)
    obs = env.reset().get("observation")
    grid = np.asarray(env.envs[0].unwrapped.game.state())  # [10, 10, C] booleans
    assert obs.dtype == torch.uint8 and obs.shape == (1, grid.shape[-1], 10, 10)
    assert torch.equal(obs[0], torch.from_numpy(grid.transpose(2, 0, 1).astype(np.uint8)))
    assert int(env.observation_spec["observation"].space.high.max()) == 1
    frame = env.envs[0].render()
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8 and frame.any()


class _Scored(gym.Env):
    """Rewards of 5, then -3, then 0.5, for two steps each... an episode of 6 steps."""

    observation_space = gym.spaces.Box(0, 255, (2, 3, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.t = 0
        return np.zeros((2, 3, 3), np.uint8), {}

    def step(self, action):
        self.t += 1
        reward = [5.0, -3.0, 0.5][(self.t - 1) // 2]
        return np.full((2, 3, 3), self.t, np.uint8), reward, self.t == 6, False, {}


def test_rewards_are_clipped_for_training_while_the_return_keeps_the_score():
    for clip in (True, False):
        env = GymVecEnv([_Scored], reward_clip=clip)
        td = env.reset()
        rewards = []
        for _ in range(6):
            td["action"] = torch.zeros(1, dtype=torch.long)
            td, nxt = env.step_and_maybe_reset(td)
            rewards.append(float(td["next", "reward"]))
            last = td["next"]
            td = nxt
        assert rewards == ([1.0, 1.0, -1.0, -1.0, 1.0, 1.0] if clip else [5.0, 5.0, -3.0, -3.0, 0.5, 0.5])
        assert float(last["episode_reward"]) == 5.0  # 10 - 6 + 1: the game's score either way
        assert last["observation"].dtype == torch.uint8


def test_only_training_envs_clip_rewards():
    cfg = EnvConfig(id="ALE/Pong-v5", preprocess="atari", frame_stack=4, reward_clip=True)
    assert make_env(cfg, num_envs=1, train=True).reward_clip
    assert not make_env(cfg, num_envs=1).reward_clip  # evaluation


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ale_py" else real(name, *a)
    )
    monkeypatch.delitem(gym.registry, "ALE/Tennis-v5")
    with pytest.raises(MissingExtraError, match=r"pip install 'rl_lightning\[atari\]'"):
        check_env_id("ALE/Tennis-v5")


def test_encoders_scale_on_the_device_and_are_chosen_by_the_observation():
    pixels = Bounded(0, 255, shape=(1, 4, 84, 84), dtype=torch.uint8)
    grid = Bounded(0, 1, shape=(1, 6, 10, 10), dtype=torch.uint8)
    vector = Unbounded((1, 8), dtype=torch.float32)
    nature, small = make_encoder("auto", pixels), make_encoder("auto", grid)
    assert isinstance(nature, ImageEncoder) and nature.out_features == 3136
    assert isinstance(small, ImageEncoder) and small.out_features == 16 * 8 * 8
    assert make_encoder("auto", vector) is None
    assert isinstance(make_encoder("mlp", grid), FlatEncoder)
    # The Nature torso (Mnih et al. 2015): 32x8x8/4, 64x4x4/2, 64x3x3/1.
    convs = [m for m in nature.layers if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [
        (32, 8, 4),
        (64, 4, 2),
        (64, 3, 1),
    ]
    x = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(nature(x), nature.layers(x.float() / 255).flatten(1))
    assert nature(x.float()).shape == (5, 3136)  # float pixel values (the exported policy's input) too
    with pytest.raises(ValueError, match="encoder=minatar_cnn"):
        make_encoder("nature_cnn", grid)
    with pytest.raises(ValueError, match="encoder=mlp"):
        make_encoder("minatar_cnn", vector)


@pytest.mark.slow
@pytest.mark.parametrize("name", SMOKED)
def test_image_experiment_fits_resumes_and_evaluates_through_the_cli(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    # A Nature-CNN update costs tens of milliseconds on a CPU (IQN's, over 64 quantiles, hundreds): few of
    # them, on small batches, and short evaluation episodes.
    cheaper = [
        "collect.warmup_frames=450", "env.max_episode_steps=50", "eval.episodes=1", "replay.batch_size=8",
    ]  # fmt: skip
    cheaper = cheaper if "atari" in name else []
    quick = [f"+experiment={name}", "+debug=quick", "device=cpu", *cheaper]
    assert main(["fit", *quick]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        out["frames"] >= 500 and out["updates"] > 0 and "eval/return_mean" in out
    )  # whole steps of all envs
    replay = Path(out["last_ckpt"] + ".replay")
    # Frames stored once, beside the transitions; an on-policy run keeps its one rollout instead.
    assert (replay / ("rollout.pt" if name.startswith("ppo") else "frames.pt")).is_file()
    assert main(["fit", *quick, "total_frames=600", "ckpt_path=last"]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["frames"] >= 600 and resumed["run_dir"] == out["run_dir"]
    video = name in ("dqn_minatar", "dqn_atari_cpu")
    args = [
        "evaluate",
        f"ckpt={resumed['last_ckpt']}",
        "episodes=1",
        "logger=none",
        f"video={str(video).lower()}",
    ]
    assert main(args) == 0
    if video:
        assert list(Path(resumed["last_ckpt"]).parent.glob("*video*"))


def test_the_atari_policy_acts_on_stacked_uint8_frames():
    cfg_env = make_env(ATARI, num_envs=2, seed=1)
    from rl_lightning.algos.dqn import DQN

    module = DQN(cfg_env.observation_spec, cfg_env.action_spec, hidden_sizes=[512])
    td = cfg_env.reset()
    actions = module.act_eval(TensorDict({"observation": td["observation"]}, [2]))["action"]
    assert actions.shape == (2,) and actions.dtype == torch.int64
    assert isinstance(module.online.encoder, ImageEncoder)
