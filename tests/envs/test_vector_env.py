"""GymVecEnv under the real TorchRL collector: autoreset semantics, episode statistics, seeding."""

from __future__ import annotations

import pytest
import torch
from torchrl.collectors import Collector

from rl_lightning.envs import EnvConfig, UnknownEnvError, make_env


def collect(seed: int, n_envs: int = 3, steps: int = 120):
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=n_envs), seed=seed)
    torch.manual_seed(seed)
    c = Collector(env, None, frames_per_batch=n_envs * steps, total_frames=-1, trust_policy=True)
    data = next(iter(c))
    c.shutdown()
    return data


def test_final_observation_and_reset_observation_are_kept_apart():
    data = collect(0)
    done = data["next", "done"].squeeze(-1)
    assert done.any()
    env_i, t = (done[:, :-1]).nonzero()[0].tolist()
    final_obs = data["next", "observation"][env_i, t]
    next_root = data["observation"][env_i, t + 1]
    # CartPole ends when the pole falls or the cart leaves the track: the final observation shows it,
    # the next step starts from a fresh state near zero.
    assert (final_obs[2].abs() > 0.2) or (final_obs[0].abs() > 2.4)
    assert next_root.abs().max() < 0.05
    assert data["step_count"][env_i, t + 1].item() == 0


def test_episode_statistics_match_the_rewards():
    data = collect(1)
    for i in range(data.shape[0]):
        rewards = data["next", "reward"][i].squeeze(-1)
        done = data["next", "done"][i].squeeze(-1)
        ends = done.nonzero().squeeze(-1).tolist()
        start = 0  # every env starts at a reset at the beginning of the batch
        for end in ends:
            ep_return = data["next", "episode_reward"][i, end].item()
            ep_len = data["next", "step_count"][i, end].item()
            assert ep_return == pytest.approx(rewards[start : end + 1].sum().item())
            assert ep_len == end + 1 - start
            start = end + 1


def test_same_seed_same_data_other_seed_other_data():
    a, b, c = collect(5), collect(5), collect(6)
    assert torch.equal(a["observation"], b["observation"]) and torch.equal(a["action"], b["action"])
    assert not torch.equal(a["observation"], c["observation"])


def test_unknown_id_suggests_close_matches():
    with pytest.raises(UnknownEnvError, match="CartPole-v1"):
        make_env(EnvConfig(id="CartPole-v9"))


@pytest.mark.slow
def test_async_vectorization_gives_the_same_keys():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=2, vectorization="async"), seed=0)
    try:
        td = env.rollout(30, break_when_any_done=False)
        assert td.shape == (2, 30)
        assert {"observation", "episode_reward", "step_count"} <= set(td["next"].keys())
    finally:
        env.close()


def test_the_collectors_step_equals_torchrls_step_then_step_mdp():
    """The lean ``step_and_maybe_reset`` gives what ``EnvBase.step`` followed by ``step_mdp`` gives, across
    episode ends, and carries the policy's other entries into the next root as ``step_mdp`` does."""
    lean, generic = (make_env(EnvConfig(id="CartPole-v1", num_envs=3), seed=7) for _ in range(2))
    root_lean, root_generic = lean.reset(), generic.reset()
    g = torch.Generator().manual_seed(0)
    ends = 0
    for _ in range(120):
        action = torch.randint(0, 2, (3,), generator=g)
        for root in (root_lean, root_generic):
            root.set("action", action.clone())
            root.set("policy_note", action.float() * 2)  # something a policy writes besides the action
        root_generic.set("_step", torch.ones(3, dtype=torch.bool))  # forces EnvBase.step + step_mdp
        out_lean, root_lean = lean.step_and_maybe_reset(root_lean)
        out_generic, root_generic = generic.step_and_maybe_reset(root_generic)
        assert (out_lean["next"] == out_generic["next"]).all()
        assert set(root_lean.keys()) == set(root_generic.keys()) - {"_step"}
        assert (root_lean == root_generic.exclude("_step")).all()
        assert torch.equal(root_lean["policy_note"], action.float() * 2)
        ends += int(out_lean["next", "done"].sum())
    assert ends > 0  # CartPole episodes ended (and were reset inside the step) along the way
