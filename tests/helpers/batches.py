"""Random transition batches for the algorithm tests: one factory, :func:`transitions`, and what builds on it.

The algorithm tests update their modules on batches in TorchRL's layout (``observation``, ``action`` and
``next`` with ``observation``, ``reward``, ``terminated``, ``truncated``, ``done``) drawn from a seeded
generator. :func:`transitions` draws, in this order: which rows are terminal, the observations, the
actions, the next observations, the rewards. Tests that check something against a particular draw depend
on that order: keep it.

- :func:`transitions`: ``n`` rows with discrete (an ``int``) or continuous (:func:`box`) actions;
- :func:`transition_data`: ``k`` batches and ``k`` sets of observations to act on, shaped for a module
  built from an experiment's config (the callback equivalence fits);
- :func:`discrete_specs` and :func:`quantile_module`: the specs of a small discrete env and the quantile
  family's members built on them (C51, Rainbow, QR-DQN, IQN), for ``algos/test_quantile_algos.py`` and
  ``algos/test_noisy.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict
from torchrl.data import Categorical, Composite, Unbounded

from helpers.fit import ACT_N, K
from rl_lightning.algos.quantile import C51, IQN, QRDQN

#: Draws ``[n, ...]`` actions from a generator: ``draw(n, generator)``.
ActionDraw = Callable[[int, torch.Generator], torch.Tensor]


def box(low: torch.Tensor, high: torch.Tensor) -> ActionDraw:
    """Continuous actions uniform in ``[low, high]`` (``[A]`` each): ``[n, A]``."""
    return lambda n, g: low + (high - low) * torch.rand(n, low.numel(), generator=g)


def transitions(
    n: int,
    obs_dim: int,
    actions: int | ActionDraw,
    seed: int | torch.Generator = 1,
    *,
    terminated: float = 0.1,
    reward: Callable[..., torch.Tensor] = torch.randn,
) -> TensorDict:
    """``n`` random transitions with ``[n, obs_dim]`` observations.

    Args:
        actions: the number of discrete actions (``[n]`` indices, uniform), or a draw of continuous ones
            (:func:`box`).
        seed: a seed for a fresh generator, or a generator to keep drawing from (several batches of one
            stream).
        terminated: the probability that a row is terminal (``done`` equals ``terminated``; nothing is
            truncated).
        reward: draws the ``[n, 1]`` rewards as ``reward(n, 1, generator=g)``.
    """
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    term = torch.rand(n, 1, generator=g) < terminated
    obs = torch.randn(n, obs_dim, generator=g)
    action = torch.randint(0, actions, (n,), generator=g) if isinstance(actions, int) else actions(n, g)
    return TensorDict(
        {
            "observation": obs,
            "action": action,
            "next": {
                "observation": torch.randn(n, obs_dim, generator=g),
                "reward": reward(n, 1, generator=g),
                "terminated": term,
                "truncated": torch.zeros(n, 1, dtype=torch.bool),
                "done": term.clone(),
            },
        },
        batch_size=[n],
    )


def transition_data(
    module: torch.nn.Module,
    k: int = K,
    *,
    seed: int,
    reward: Callable[..., torch.Tensor] = torch.randn,
    b: int = 64,
) -> tuple[list, list]:
    """``k`` batches of ``b`` random transitions (a tenth of them terminal; actions uniform over the
    module's action space, discrete or continuous; rewards ``reward(b, 1, generator=g)``) and ``k`` batches
    of ``ACT_N`` observations to act on, all drawn from one generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    obs_dim = int(module.obs_shape[0])

    def continuous(n: int, g: torch.Generator) -> torch.Tensor:
        """Uniform in ``[-1, 1]``, mapped to the env's bounds as the module maps its own actions."""
        return module.actions.to_env(2 * torch.rand(n, module.actions.action_dim, generator=g) - 1)

    actions = module.n_actions if hasattr(module, "n_actions") else continuous
    batches = [transitions(b, obs_dim, actions, g, reward=reward) for _ in range(k)]
    obs = [TensorDict({"observation": torch.randn(ACT_N, obs_dim, generator=g)}, [ACT_N]) for _ in range(k)]
    return batches, obs


def rollout_data(
    module: torch.nn.Module, k: int = K, *, seed: int, n: int = 4, t: int = 16
) -> tuple[list, list]:
    """An on-policy module's ``k`` minibatches of one prepared rollout of ``n`` envs × ``t`` steps (its own
    sampled actions and log-probabilities, a tenth of the steps terminal and a tenth truncated), and ``k``
    batches of ``ACT_N`` observations to act on, all from one generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    obs_dim = int(module.obs_shape[0])
    state = torch.get_rng_state()
    torch.manual_seed(seed)  # act samples from the global generator
    observation = torch.randn(n * t, obs_dim, generator=g)
    rollout = module.act(TensorDict({"observation": observation}, [n * t])).reshape(n, t)
    torch.set_rng_state(state)
    terminated = torch.rand(n, t, 1, generator=g) < 0.1
    truncated = ~terminated & (torch.rand(n, t, 1, generator=g) < 0.1)
    rollout["next"] = TensorDict(
        {
            "observation": torch.randn(n, t, obs_dim, generator=g),
            "reward": torch.randn(n, t, 1, generator=g),
            "terminated": terminated,
            "done": terminated | truncated,
        },
        [n, t],
    )
    module.prepare_rollout(rollout)
    rows = rollout.reshape(-1)
    batches = [rows[torch.randperm(n * t, generator=g)[: n * t // 2]] for _ in range(k)]
    obs = [TensorDict({"observation": torch.randn(ACT_N, obs_dim, generator=g)}, [ACT_N]) for _ in range(k)]
    return batches, obs


#: The small discrete env of :func:`discrete_specs`: 4 observations, 3 actions.
OBS_DIM, N_ACTIONS = 4, 3


def discrete_specs(obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS) -> tuple[Composite, Categorical]:
    """The observation and action specs of one env with ``[obs_dim]`` observations and ``n_actions``."""
    return Composite(observation=Unbounded((1, obs_dim)), shape=(1,)), Categorical(n_actions, shape=(1,))


#: Epsilon-greedy off: acting is greedy (or explores by noise alone).
EPS0 = {"eps_start": 0.0, "eps_end": 0.0}


def quantile_module(name: str, **kw):
    """A small member of the quantile family on :func:`discrete_specs` (``OBS_DIM``, ``N_ACTIONS``), seeded:
    ``c51``, ``rainbow`` (C51 with noisy, dueling, double Q, no epsilon), ``qrdqn`` or ``iqn``; ``kw``
    overrides its arguments."""
    torch.manual_seed(0)
    obs, act = discrete_specs()
    if name == "c51":
        return C51(obs, act, hidden_sizes=(32, 32), n_atoms=11, v_min=-5.0, v_max=5.0, **kw)
    if name == "rainbow":
        kw = {"noisy": True, "dueling": True, "double_dqn": True, **EPS0, **kw}
        return C51(obs, act, hidden_sizes=(32, 32), n_atoms=11, v_min=-5.0, v_max=5.0, **kw)
    if name == "qrdqn":
        return QRDQN(obs, act, hidden_sizes=(32, 32), n_quantiles=8, **kw)
    if name == "iqn":
        kw = {"n_quantiles": 8, "n_target_quantiles": 6, "n_policy_quantiles": 5, "n_cos": 16, **kw}
        return IQN(obs, act, hidden_sizes=(32, 32), **kw)
    raise KeyError(name)
