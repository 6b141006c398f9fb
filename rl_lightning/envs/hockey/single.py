"""Single-agent hockey: player 1 against an opponent policy, with continuous or discrete actions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rl_lightning.envs.hockey.constants import Mode
from rl_lightning.envs.hockey.env import ACTION_DIM, CategoricalMix, HockeyEnv
from rl_lightning.envs.hockey.opponent import BasicOpponent

OpponentPolicy = Callable[[np.ndarray], Any]
OpponentSpec = str | Mapping[str, float] | OpponentPolicy | torch.nn.Module

#: The opponents the env plays by name (BasicOpponent, weak or strong); other names are given policies.
NAMED_OPPONENTS = ("weak", "strong")

# Discrete codes in the player's own frame: each sets one component to +-1 (shoot: component 3 to +1).
DISCRETE_ACTIONS = np.array(
    [
        [0, 0, 0, 0],  # 0 nothing
        [-1, 0, 0, 0],  # 1 x - 1
        [1, 0, 0, 0],  # 2 x + 1
        [0, -1, 0, 0],  # 3 y - 1
        [0, 1, 0, 0],  # 4 y + 1
        [0, 0, -1, 0],  # 5 angle - 1
        [0, 0, 1, 0],  # 6 angle + 1
        [0, 0, 0, 1],  # 7 shoot
    ],
    dtype=np.float32,
)
DISCRETE_ACTIONS.flags.writeable = False


def discrete_to_continuous(code: int) -> np.ndarray:
    """The (4,) float32 continuous action of a discrete code 0-7 (see ``DISCRETE_ACTIONS``)."""
    c = int(code)
    if not 0 <= c < len(DISCRETE_ACTIONS):
        raise ValueError(f"discrete hockey action must be in 0..7, got {code!r}")
    return DISCRETE_ACTIONS[c].copy()


def _policy_name(name: Any, policies: Mapping[str, Any]) -> str:
    """``"weak"``/``"strong"`` (any case) or the name of one of ``policies``, as a key of an opponent mix."""
    key = str(name).strip()
    if key.lower() in NAMED_OPPONENTS:
        return key.lower()
    if key in policies:
        return key
    extra = f" or one of the given policies {sorted(policies)}" if policies else ""
    raise ValueError(f"opponent mix keys must be 'weak', 'strong'{extra}, got {name!r}")


class PolicyOpponent:
    """A torch policy as a hockey opponent: ``obs18 (numpy) -> action4 (numpy float32)``.

    The policy maps observations ``[N, 18]`` to actions, as ``RLModule.export_policy()`` returns it: four
    continuous values per row (``[N, 4]``, clipped to [-1, 1] by the env) or a discrete code per row
    (``[N]`` integers, mapped through :data:`DISCRETE_ACTIONS`). It runs on the CPU without gradients.

    Args:
        policy: the module (for self-play, a frozen copy of the agent's deterministic policy).

    Example:
        >>> opponent = PolicyOpponent(agent.export_policy())  # doctest: +SKIP
        >>> env = HockeyVsOpponentEnv(opponent=opponent)  # doctest: +SKIP
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        self.policy = policy

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(np.asarray(obs, dtype=np.float32)).unsqueeze(0)
        with torch.inference_mode():
            out = self.policy(x)
        if out.is_floating_point():
            if out.numel() != ACTION_DIM:
                raise ValueError(
                    f"a policy opponent must return {ACTION_DIM} continuous actions or one discrete code "
                    f"per observation, got shape {tuple(out.shape)}"
                )
            return out.reshape(ACTION_DIM).numpy()
        if out.numel() != 1:
            raise ValueError(f"a discrete policy opponent must return one code, got shape {tuple(out.shape)}")
        return DISCRETE_ACTIONS[int(out.reshape(()))]


def _as_policy(opponent: Any) -> OpponentPolicy:
    """A torch module becomes a :class:`PolicyOpponent`; any other callable is used as it is."""
    if isinstance(opponent, torch.nn.Module):
        return PolicyOpponent(opponent)
    if callable(opponent):
        return opponent
    raise TypeError(f"opponent must be a name, a mix dict or a callable, got {type(opponent).__name__}")


class _OpponentChoice:
    """A parsed opponent setting: a fixed name, a per-episode mix of names, or one callable."""

    def __init__(
        self, spec: OpponentSpec, policies: Mapping[str, OpponentPolicy | torch.nn.Module] | None = None
    ) -> None:
        named: dict[str, OpponentPolicy] = {}
        for name, policy in (policies or {}).items():
            if not isinstance(name, str) or not name.strip() or name.strip().lower() in NAMED_OPPONENTS:
                raise ValueError(f"policy opponents need names other than 'weak' and 'strong', got {name!r}")
            named[name] = _as_policy(policy)
        self.policies = named
        self.mix: CategoricalMix[str] | None = None
        self.fixed: str | None = None
        self.callable: OpponentPolicy | None = None
        if isinstance(spec, str):
            self.fixed = _policy_name(spec, named)
        elif isinstance(spec, Mapping):
            self.mix = CategoricalMix(spec, lambda key: _policy_name(key, named), "opponent")
        else:
            self.callable = _as_policy(spec)

    @property
    def first(self) -> str | None:
        """The name played before the first draw (the mix's first choice), ``None`` for a callable."""
        return self.mix.choices[0] if self.mix is not None else self.fixed


class HockeyVsOpponentEnv(HockeyEnv):
    """Player 1's side of :class:`HockeyEnv` against an opponent that plays player 2.

    Observation and reward are player 1's (18-dim float32); the action is player 1's 4 values. Before each
    step the opponent acts on :meth:`obs_agent_two`. ``info`` carries ``winner`` and the reward terms.

    Args:
        opponent: ``"weak"`` or ``"strong"`` (:class:`BasicOpponent`); a mix such as
            ``{"weak": 0.5, "strong": 0.5}``, drawn per episode from the env's generator; or any callable
            ``obs18 -> action4`` (for example a saved agent, for self-play; a torch module mapping
            ``[N, 18]`` observations to actions is wrapped in a :class:`PolicyOpponent`). A callable with a
            ``seed(int)`` method is reseeded on every seeded reset; the BasicOpponent always is.
        mode: game mode (:class:`Mode`, name or value) or a per-episode mode mix (see :class:`HockeyEnv`).
        keep_mode: puck holding (see :class:`HockeyEnv`).
        render_mode: None, ``"rgb_array"`` or ``"human"``.

    :meth:`set_curriculum` changes the mode and the opponent of the episodes that follow (a training
    curriculum, self-play against snapshots of the agent).

    Example:
        >>> env = HockeyVsOpponentEnv(opponent={"weak": 0.7, "strong": 0.3})
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> env.unwrapped.opponent_name  # the episode's draw
        'weak'
    """

    def __init__(
        self,
        opponent: OpponentSpec = "weak",
        mode: Mode | str | int | Mapping[Mode | str | int, float] = Mode.NORMAL,
        keep_mode: bool = True,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(mode=mode, keep_mode=keep_mode, render_mode=render_mode)
        self.action_space = spaces.Box(-1.0, 1.0, (ACTION_DIM,), dtype=np.float32)
        self._basic = BasicOpponent(weak=True, keep_mode=self.keep_mode)
        # The BasicOpponent is called through act_values: same floats as act, without the array round trip.
        self._policy: OpponentPolicy = self._basic.act_values
        self._uses_basic = True
        self.opponent_name: str = "weak"
        self._choice = _OpponentChoice(opponent)
        self._next_choice: _OpponentChoice | None = None
        self._play(self._choice.first)
        self._opponent_seeded = False

    def _play(self, name: str | None) -> None:
        """Makes ``name`` (or the callable, for ``None``) the opponent of the episode."""
        choice = self._choice
        if name is None:
            self._policy = choice.callable  # type: ignore[assignment]
            self._uses_basic = False
            self.opponent_name = getattr(choice.callable, "__name__", type(choice.callable).__name__)
        elif name in NAMED_OPPONENTS:
            self._basic.weak = name == "weak"
            self._policy = self._basic.act_values
            self._uses_basic = True
            self.opponent_name = name
        else:
            self._policy = choice.policies[name]
            self._uses_basic = False
            self.opponent_name = name

    @property
    def opponent(self) -> OpponentPolicy:
        """The policy that plays player 2: the BasicOpponent or the given callable."""
        return self._basic if self._uses_basic else self._policy

    @property
    def opponent_mix(self) -> CategoricalMix[str] | None:
        """The per-episode opponent mix in use, ``None`` for a fixed opponent."""
        return self._choice.mix

    def set_curriculum(
        self,
        mode: Mode | str | int | Mapping[Mode | str | int, float] | None = None,
        opponent: OpponentSpec | None = None,
        policies: Mapping[str, OpponentPolicy | torch.nn.Module] | None = None,
    ) -> None:
        """Changes what the episodes play from the next reset on (the episode under way is left alone).

        Args:
            mode: the mode or mode mix (see :meth:`HockeyEnv.set_mode`); ``None`` keeps it.
            opponent: as the constructor's ``opponent``; a mix may also name ``policies``, for example
                ``{"weak": 0.3, "strong": 0.4, "self_0": 0.15, "self_1": 0.15}``. ``None`` keeps it.
            policies: named opponent policies (callables ``obs18 -> action4`` or torch modules, see
                :class:`PolicyOpponent`) that ``opponent`` may name; they replace earlier ones.

        Raises:
            ValueError, TypeError: a bad mode or opponent (nothing is changed then).
        """
        choice = None if opponent is None else _OpponentChoice(opponent, policies)
        if mode is not None:
            self.set_mode(mode)
        if choice is not None:
            self._next_choice = choice

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode; a seed also reseeds the opponent (from a child of the seed's sequence).

        Args:
            seed: seeds the env and its opponent.
            options: as for :meth:`HockeyEnv.reset`.

        Returns:
            The first observation and the info dict.
        """
        obs, info = super().reset(seed=seed, options=options)
        if self._next_choice is not None:
            self._choice, self._next_choice = self._next_choice, None
            self._play(self._choice.first)
        if seed is not None or not self._opponent_seeded:
            # A spawned child keeps the opponent's stream independent of the env's start-position draws.
            child = np.random.SeedSequence(seed).spawn(1)[0]
            opponent_seed = int(child.generate_state(1, dtype=np.uint64)[0])
            self._basic.seed(opponent_seed)
            for policy in (self._choice.callable, *self._choice.policies.values()):
                reseed = getattr(policy, "seed", None)
                if callable(reseed):
                    reseed(opponent_seed)
            self._opponent_seeded = True
        if self._choice.mix is not None:
            self._play(self._choice.mix.draw(self.np_random))
        return obs, info

    def get_env_state(self) -> dict[str, Any]:
        """:meth:`HockeyEnv.get_env_state` with the episode's opponent and the BasicOpponent's generator."""
        basic = self._basic
        return {
            **super().get_env_state(), "opponent": self.opponent_name, "seeded": self._opponent_seeded,
            "basic": {"weak": basic.weak, "phase": basic.phase, "rng": basic.rng.bit_generator.state},
        }  # fmt: skip

    def set_env_state(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned (the opponents a curriculum set are the env's
        config: the run sets them again on a resumed run's envs)."""
        super().set_env_state(state)
        name = state["opponent"]
        self._play(name if name in NAMED_OPPONENTS or name in self._choice.policies else None)
        self._opponent_seeded = bool(state["seeded"])
        basic = state["basic"]
        self._basic.weak, self._basic.phase = bool(basic["weak"]), float(basic["phase"])
        self._basic.rng.bit_generator.state = basic["rng"]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advances one tick with player 1's (4,) action and the opponent's reply to the current state."""
        buf = self._action
        buf[:ACTION_DIM] = action
        buf[ACTION_DIM:] = self._policy(self.obs_agent_two())
        return self._step(buf.tolist())


class DiscreteActionWrapper(gym.ActionWrapper):
    """Hockey with the 8 discrete codes of the course env (``Discrete(8)``) over a 4-dim continuous env.

    Codes: 0 nothing, 1 x-1, 2 x+1, 3 y-1, 4 y+1, 5 angle-1, 6 angle+1, 7 shoot.
    """

    #: Keeps nothing between steps (:mod:`rl_lightning.envs.state` saves the env behind it).
    stateless = True

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if env.action_space.shape != (ACTION_DIM,):
            raise ValueError(f"DiscreteActionWrapper needs a 4-dim action env, got {env.action_space}")
        self.action_space = spaces.Discrete(len(DISCRETE_ACTIONS))

    def action(self, action: int) -> np.ndarray:
        """Maps a code to its (4,) continuous action (a read-only row)."""
        c = int(action)
        if not 0 <= c < len(DISCRETE_ACTIONS):
            raise ValueError(f"discrete hockey action must be in 0..7, got {action!r}")
        return DISCRETE_ACTIONS[c]


def make_vs_opponent_discrete(**kwargs: Any) -> DiscreteActionWrapper:
    """Entry point of ``HockeyVsOpponentDiscrete-v0``: :class:`HockeyVsOpponentEnv` with discrete actions."""
    return DiscreteActionWrapper(HockeyVsOpponentEnv(**kwargs))
