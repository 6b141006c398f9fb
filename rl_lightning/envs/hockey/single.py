"""Single-agent hockey: player 1 against an opponent policy, with continuous or discrete actions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rl_lightning.envs.hockey.constants import Mode
from rl_lightning.envs.hockey.env import ACTION_DIM, CategoricalMix, HockeyEnv
from rl_lightning.envs.hockey.opponent import BasicOpponent

OpponentPolicy = Callable[[np.ndarray], Any]
OpponentSpec = str | Mapping[str, float] | OpponentPolicy

_NAMED = ("weak", "strong")

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


def _opponent_name(name: Any) -> str:
    """``"weak"`` or ``"strong"`` (any case) as a key of an opponent mix."""
    key = str(name).strip().lower()
    if key not in _NAMED:
        raise ValueError(f"opponent mix keys must be 'weak' and/or 'strong', got {name!r}")
    return key


class HockeyVsOpponentEnv(HockeyEnv):
    """Player 1's side of :class:`HockeyEnv` against an opponent that plays player 2.

    Observation and reward are player 1's (18-dim float32); the action is player 1's 4 values. Before each
    step the opponent acts on :meth:`obs_agent_two`. ``info`` carries ``winner`` and the reward terms.

    Args:
        opponent: ``"weak"`` or ``"strong"`` (:class:`BasicOpponent`); a mix such as
            ``{"weak": 0.5, "strong": 0.5}``, drawn per episode from the env's generator; or any callable
            ``obs18 -> action4`` (for example a saved agent, for self-play). A callable with a ``seed(int)``
            method is reseeded on every seeded reset; the BasicOpponent always is.
        mode: game mode (:class:`Mode`, name or value) or a per-episode mode mix (see :class:`HockeyEnv`).
        keep_mode: puck holding (see :class:`HockeyEnv`).
        render_mode: None, ``"rgb_array"`` or ``"human"``.

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
        self._opponent_mix: CategoricalMix[str] | None = None
        self._uses_basic = True
        # The BasicOpponent is called through act_values: same floats as act, without the array round trip.
        self._policy: OpponentPolicy
        self.opponent_name: str
        if isinstance(opponent, str):
            name = opponent.strip().lower()
            if name not in _NAMED:
                raise ValueError(
                    f"opponent must be 'weak', 'strong', a mix dict or a callable, got {opponent!r}"
                )
            self._basic.weak = name == "weak"
            self._policy = self._basic.act_values
            self.opponent_name = name
        elif isinstance(opponent, Mapping):
            self._opponent_mix = CategoricalMix(opponent, _opponent_name, "opponent")
            self._policy = self._basic.act_values
            self.opponent_name = self._opponent_mix.choices[0]
            self._basic.weak = self.opponent_name == "weak"
        elif callable(opponent):
            self._policy = opponent
            self._uses_basic = False
            self.opponent_name = getattr(opponent, "__name__", type(opponent).__name__)
        else:
            raise TypeError(
                f"opponent must be a name, a mix dict or a callable, got {type(opponent).__name__}"
            )
        self._opponent = opponent
        self._opponent_seeded = False

    @property
    def opponent(self) -> OpponentPolicy:
        """The policy that plays player 2: the BasicOpponent or the given callable."""
        return self._basic if self._uses_basic else self._policy

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
        if seed is not None or not self._opponent_seeded:
            # A spawned child keeps the opponent's stream independent of the env's start-position draws.
            child = np.random.SeedSequence(seed).spawn(1)[0]
            opponent_seed = int(child.generate_state(1, dtype=np.uint64)[0])
            self._basic.seed(opponent_seed)
            reseed = getattr(self._opponent, "seed", None)
            if not self._uses_basic and callable(reseed):
                reseed(opponent_seed)
            self._opponent_seeded = True
        if self._opponent_mix is not None:
            self.opponent_name = self._opponent_mix.draw(self.np_random)
            self._basic.weak = self.opponent_name == "weak"
        return obs, info

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
