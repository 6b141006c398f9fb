"""Two-player laser hockey as a gymnasium env (both players' actions in one 8-dim action)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rl_lightning.envs.hockey import constants as C
from rl_lightning.envs.hockey.constants import Mode
from rl_lightning.envs.hockey.render import Window, draw_frame
from rl_lightning.envs.hockey.world import HockeyWorld

OBS_DIM = 18
ACTION_DIM = 4  # per player: force x, force y, torque, shoot

# Player 2's view is a 180 degree point reflection of player 1's: index map and signs (angles keep theirs).
MIRROR_INDEX = (6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 17, 16)
MIRROR_SIGN = (-1, -1, 1, -1, -1, 1, -1, -1, 1, -1, -1, 1, -1, -1, -1, -1, 1, 1)


K = TypeVar("K", bound=Hashable)


class CategoricalMix(Generic[K]):
    """A per-episode draw among named choices, e.g. ``{"weak": 0.7, "strong": 0.3}`` or a mode mix.

    Args:
        mix: choice -> non-negative weight (normalised); at least one weight must be positive.
        coerce: maps each key to its canonical choice and raises ``ValueError`` for an unknown one.
        what: the option's name, for error messages.

    A draw takes one uniform number ``u`` from the env's generator and returns the first choice whose
    cumulative probability exceeds ``u`` (the mapping's order), so ``{a: p, b: q}`` picks ``a`` iff
    ``u < p / (p + q)``.
    """

    def __init__(self, mix: Mapping[Any, float], coerce: Callable[[Any], K], what: str) -> None:
        choices: list[K] = []
        weights: list[float] = []
        for key, weight in mix.items():
            choice = coerce(key)
            if choice in choices:
                raise ValueError(f"{what} mix names {choice!r} twice: {dict(mix)}")
            try:
                w = float(weight)
            except (TypeError, ValueError):
                raise ValueError(f"{what} mix weights must be numbers, got {weight!r} for {key!r}") from None
            if not (w >= 0 and math.isfinite(w)):
                raise ValueError(f"{what} mix weights must be finite and >= 0, got {weight!r} for {key!r}")
            choices.append(choice)
            weights.append(w)
        total = sum(weights)
        if total <= 0:
            raise ValueError(f"{what} mix needs a positive weight, got {dict(mix)}")
        self.choices: tuple[K, ...] = tuple(choices)
        self.probabilities: tuple[float, ...] = tuple(w / total for w in weights)
        self._cumulative = np.cumsum(self.probabilities)

    def draw(self, rng: np.random.Generator) -> K:
        """One choice, from one ``rng.random()`` draw."""
        u = rng.random()
        index = int(np.searchsorted(self._cumulative, u, side="right"))
        return self.choices[min(index, len(self.choices) - 1)]

    def __repr__(self) -> str:
        return f"CategoricalMix({dict(zip(self.choices, self.probabilities))})"


def mirror_observation(obs: np.ndarray) -> np.ndarray:
    """Maps a player-1 observation (..., 18) to the same state seen by player 2 (and back)."""
    return np.asarray(obs)[..., list(MIRROR_INDEX)] * np.asarray(MIRROR_SIGN, dtype=np.float32)


class HockeyEnv(gym.Env[np.ndarray, np.ndarray]):
    """Laser hockey for two players on one Box2D rink.

    Observation (18, float32, player-1 frame, positions relative to the rink centre): player 1's position,
    angle, velocity and angular velocity (0-5), the same for player 2 (6-11), puck position (12-13) and
    velocity (14-15), player 1's and player 2's puck-hold counters (16-17). Action (8, float32 in [-1, 1]):
    ``[p1 force x, force y, torque, shoot, p2 force x, force y, torque, shoot]``, each player in its own
    frame (+x toward the opponent). Reward and ``info`` are player 1's; :meth:`obs_agent_two`,
    :meth:`get_info_agent_two` and :meth:`get_reward_agent_two` give player 2's.

    An episode ends with ``terminated=True`` when the puck enters a goal (``info["winner"]`` = +1 if player 1
    scored, -1 otherwise) and with ``truncated=True`` after 251 steps in NORMAL mode or 81 in the training
    modes. Who starts (the puck's half in NORMAL mode) alternates between resets; the first reset of an env
    and every seeded reset draw it from the seed instead, so a seed fixes the whole episode.

    Args:
        mode: NORMAL, TRAIN_SHOOTING or TRAIN_DEFENSE, as a :class:`Mode`, its name or its value; or a
            curriculum ``{mode: weight}`` such as ``{"NORMAL": 0.5, "TRAIN_SHOOTING": 0.25,
            "TRAIN_DEFENSE": 0.25}``, from which every reset draws the episode's mode (its start positions
            and its time limit) with the env's generator.
        keep_mode: whether a player catches the puck on contact and holds it until it shoots (at most 14
            steps). Without it the counters stay 0 and the shoot components are ignored.
        render_mode: None, ``"rgb_array"`` or ``"human"`` (needs pygame).

    Example:
        >>> env = HockeyEnv(mode="TRAIN_SHOOTING")
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["human", "rgb_array"], "render_fps": C.FPS}

    def __init__(
        self,
        mode: Mode | str | int | Mapping[Mode | str | int, float] = Mode.NORMAL,
        keep_mode: bool = True,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None, 'rgb_array' or 'human', got {render_mode!r}")
        self.render_mode = render_mode
        self._mode_mix: CategoricalMix[Mode] | None = None
        self._next_mode: Mode | None = None  # a fixed mode set by set_mode, taken at the next reset
        if isinstance(mode, Mapping):
            self._mode_mix = CategoricalMix(mode, Mode.coerce, "mode")
            mode = self._mode_mix.choices[0]
        self._mode = Mode.coerce(mode)
        self.keep_mode = bool(keep_mode)
        self.observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (2 * ACTION_DIM,), dtype=np.float32)
        self._world = HockeyWorld(self.keep_mode)
        self._one_starts = True
        self._side_drawn = False
        self._time = 0
        self._set_mode_constants()
        self._state = self._world.state()
        #: The episode's start and both players' actions since, which replay it in a fresh world (``None``
        #: once :meth:`set_state` moved the bodies).
        self._episode: dict[str, Any] | None = None
        # Actions pass through this float32 buffer: one C-level copy casts and shape-checks them.
        self._action = np.zeros(2 * ACTION_DIM, dtype=np.float32)
        self._window: Window | None = None

    @property
    def mode(self) -> Mode:
        """The current episode's game mode; change it with ``reset(options={"mode": ...})``."""
        return self._mode

    @property
    def mode_mix(self) -> CategoricalMix[Mode] | None:
        """The per-episode mode mix (given as ``mode`` or to :meth:`set_mode`), ``None`` for a fixed mode."""
        return self._mode_mix

    def set_mode(self, mode: Mode | str | int | Mapping[Mode | str | int, float]) -> None:
        """Sets the mode, or the per-episode mode mix, of the episodes from the next reset on.

        The episode under way keeps its mode: a curriculum that moves on during training changes what the
        envs play without cutting an episode short.

        Args:
            mode: as the constructor's ``mode`` (a :class:`Mode`, its name or value, or a mix).

        Raises:
            ValueError: an unknown mode or a bad mix (nothing is changed then).
        """
        if isinstance(mode, Mapping):
            self._mode_mix, self._next_mode = CategoricalMix(mode, Mode.coerce, "mode"), None
        else:
            self._mode_mix, self._next_mode = None, Mode.coerce(mode)

    @property
    def world(self) -> HockeyWorld:
        """The Box2D world (bodies, hold counters, winner)."""
        return self._world

    @property
    def max_timesteps(self) -> int:
        """250 in NORMAL mode, 80 otherwise; a timed-out episode lasts one step more."""
        return self._max_timesteps

    @property
    def one_starts(self) -> bool:
        """Whether player 1 started the current episode (the puck began in its half)."""
        return self._one_starts

    def _set_mode_constants(self) -> None:
        self._max_timesteps = self._mode.max_timesteps
        self._closeness_factor = C.CLOSENESS_MAX_REWARD / (C.CLOSENESS_MAX_DIST * self._max_timesteps / 2)
        self._direction_factor = 1.0 / (self._max_timesteps * C.MAX_PUCK_SPEED)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode.

        Args:
            seed: seeds the env's generator; the episode is then a function of the seed and the actions.
            options: ``mode`` (switches to this fixed mode from now on, replacing a mode mix) and
                ``one_starting`` (bool: player 1 starts; NORMAL mode only, TRAIN_SHOOTING always gives
                player 1 the puck).

        Returns:
            The first observation and the info dict (same keys as :meth:`step`'s).
        """
        super().reset(seed=seed)
        options = options or {}
        if options.get("mode") is not None:
            self._mode = Mode.coerce(options["mode"])
            self._mode_mix = self._next_mode = None
            self._set_mode_constants()
        elif self._mode_mix is not None:
            # A curriculum: each episode draws its mode (and so its start positions and time limit).
            self._mode = self._mode_mix.draw(self.np_random)
            self._set_mode_constants()
        elif self._next_mode is not None:
            self._mode, self._next_mode = self._next_mode, None
            self._set_mode_constants()
        # A fresh world for every episode: its physics is then a function of its start and its actions alone
        # (Box2D's solver order follows the world's history), which is what lets a checkpoint replay it. A
        # seeded episode starts as in a world just made (as the course env's); the episodes after it as in a
        # world that has run before (settled: the bodies moved to their starts meet what they touch at the
        # end of the first step), as they did when the world was kept between episodes.
        self._world.build()
        if seed is None:
            self._world.settle()
        draw_side = seed is not None or not self._side_drawn
        self._place(options.get("one_starting"), draw_side=draw_side, settled=seed is None)
        self._side_drawn = True
        self._time = 0
        state = self._world.state()
        self._state = state
        if self.render_mode == "human":
            self.render()
        return np.array(state, dtype=np.float32), self._info(state)

    def _place(self, one_starting: bool | None, draw_side: bool, settled: bool) -> None:
        # Draws happen in the course env's order (player 2, then puck, then the shot's aim), so a seed gives
        # the same start positions there and here.
        rng = self.np_random
        cx, cy = C.CENTER_X, C.CENTER_Y
        if self._mode is Mode.NORMAL:
            p2 = C.PLAYER2_START
        else:
            p2 = (C.PLAYER2_START[0] + rng.uniform(-C.W / 3, C.W / 6), cy + rng.uniform(-C.H / 4, C.H / 4))
        kick = None
        if self._mode is Mode.TRAIN_DEFENSE:
            puck = (cx + rng.uniform(0, C.W / 3), cy + 0.8 * rng.uniform(-C.H / 2, C.H / 2))
            target_y = cy + 0.6 * rng.uniform(-C.GOAL_SIZE / C.SCALE, C.GOAL_SIZE / C.SCALE)
            dx, dy = -puck[0], target_y - puck[1]
            norm = math.hypot(dx, dy)
            kick = (dx / norm, dy / norm)
        else:
            dist = rng.uniform(C.H / 8, C.H / 4)
            y = cy + rng.uniform(-C.H / 8, C.H / 8)
            if self._mode is Mode.NORMAL:
                if one_starting is not None:
                    self._one_starts = bool(one_starting)
                elif draw_side:
                    self._one_starts = bool(rng.random() < 0.5)
                else:
                    self._one_starts = not self._one_starts
                puck = (cx - dist if self._one_starts else cx + dist, y)
            else:
                puck = (cx - dist, y)
        self._world.place(C.PLAYER1_START, p2, puck)
        if kick is not None:
            self._world.kick_puck(*kick)
        self._episode = {"start": self._world.body_states(), "kick": kick, "actions": [], "settled": settled}

    def get_env_state(self) -> dict[str, Any]:
        """The game's state as plain values (the episode's start and actions, the bodies, counters, mode,
        whose start it was and the generator), which :meth:`set_env_state` restores into an env of the same
        config: what a checkpoint keeps of a training env (:mod:`rl_lightning.envs.state`)."""
        return {
            "episode": self._episode, "world": self._world.body_states(), "time": self._time,
            "mode": self._mode.name,
            "next_mode": None if self._next_mode is None else self._next_mode.name,
            "one_starts": self._one_starts, "side_drawn": self._side_drawn,
            "np_random": self.np_random.bit_generator.state,
        }  # fmt: skip

    def set_env_state(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned: the episode is replayed in a fresh world from its
        start with the same actions, which gives Box2D's contacts and solver order too, bit for bit. After
        :meth:`set_state` (no episode to replay) the bodies are put where they were, without their contacts:
        the steps after that may differ in the last bits where bodies touch."""
        episode = state["episode"]
        if episode is None:
            self._world.set_body_states(state["world"])
        else:
            world = self._world
            world.build()
            if episode["settled"]:
                world.settle()
            world.place(*((x, y) for x, y, *_ in episode["start"]["bodies"].values()))
            if episode["kick"] is not None:
                world.kick_puck(*episode["kick"])
            for action in episode["actions"]:
                world.step(action)
            episode = {**episode, "actions": [list(a) for a in episode["actions"]]}
        self._episode = episode
        self._time = int(state["time"])
        self._mode = Mode.coerce(state["mode"])
        self._next_mode = None if state["next_mode"] is None else Mode.coerce(state["next_mode"])
        self._set_mode_constants()
        self._one_starts, self._side_drawn = bool(state["one_starts"]), bool(state["side_drawn"])
        self.np_random.bit_generator.state = state["np_random"]
        self._state = self._world.state()

    def set_state(self, obs: np.ndarray) -> None:
        """Puts the game into the state an 18-dim player-1 observation describes.

        Positions, angles, velocities and hold counters are taken from ``obs``; the puck's angle and spin
        become 0, the winner is cleared and the episode's step count is kept.
        """
        values = np.asarray(obs, dtype=np.float64).reshape(OBS_DIM).tolist()
        self._world.set_state(values)
        self._episode = None
        self._state = self._world.state()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advances one tick (0.02 s) with both players' actions.

        Args:
            action: (8,) ``[p1 (4), p2 (4)]``, clipped to [-1, 1]; shoot fires above 0.5 while holding.

        Returns:
            ``(obs, reward, terminated, truncated, info)`` for player 1; reward = +-10 on a goal plus
            ``info["reward_closeness_to_puck"]``.
        """
        buf = self._action
        buf[:] = action
        return self._step(buf.tolist())

    def _step(self, a: list[float]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        world = self._world
        if self._episode is not None:
            self._episode["actions"].append(a)
        world.step(a)
        state = world.state()
        self._state = state
        winner = world.winner
        terminated = winner != 0
        truncated = not terminated and self._time >= self._max_timesteps
        info = self._info(state)
        reward = C.WIN_REWARD * winner + info["reward_closeness_to_puck"]
        self._time += 1
        if self.render_mode == "human":
            self.render()
        # A new array per step on purpose: callers keep observations (obs/next_obs pairs, replay buffers).
        return np.array(state, dtype=np.float32), reward, terminated, truncated, info

    def _info(self, s: list[float]) -> dict[str, Any]:
        # Penalise distance to the puck while it sits in or comes into player 1's half.
        closeness = 0.0
        if s[12] < 0.0 and s[14] <= 0.0:
            dx = s[0] - s[12]
            dy = s[1] - s[13]
            closeness = math.sqrt(dx * dx + dy * dy) * self._closeness_factor
        return {
            "winner": self._world.winner,
            "reward_closeness_to_puck": closeness,
            "reward_touch_puck": 1.0 if self._world.hold1 == C.MAX_TIME_KEEP_PUCK else 0.0,
            "reward_puck_direction": s[14] * self._direction_factor,
        }

    def obs_agent_two(self) -> np.ndarray:
        """The current observation from player 2's side: exactly the mirror image of player 1's."""
        s = self._state
        return np.array(
            [
                -s[6],
                -s[7],
                s[8],
                -s[9],
                -s[10],
                s[11],
                -s[0],
                -s[1],
                s[2],
                -s[3],
                -s[4],
                s[5],
                -s[12],
                -s[13],
                -s[14],
                -s[15],
                s[17],
                s[16],
            ],
            dtype=np.float32,
        )

    def get_info_agent_two(self) -> dict[str, Any]:
        """Player 2's info: the same terms computed in its frame (its half, its distance, winner negated)."""
        s = self._state
        closeness = 0.0
        if s[12] > 0.0 and s[14] >= 0.0:
            dx = s[6] - s[12]
            dy = s[7] - s[13]
            closeness = math.sqrt(dx * dx + dy * dy) * self._closeness_factor
        return {
            "winner": -self._world.winner,
            "reward_closeness_to_puck": closeness,
            "reward_touch_puck": 1.0 if self._world.hold2 == C.MAX_TIME_KEEP_PUCK else 0.0,
            "reward_puck_direction": -s[14] * self._direction_factor,
        }

    def get_reward_agent_two(self, info_two: dict[str, Any]) -> float:
        """Player 2's reward for the last step, from :meth:`get_info_agent_two`'s dict."""
        return -C.WIN_REWARD * self._world.winner + info_two["reward_closeness_to_puck"]

    def render(self) -> np.ndarray | None:
        """Returns a (480, 600, 3) uint8 frame (y up) in ``rgb_array`` mode; shows it in ``human`` mode."""
        if self.render_mode is None:
            gym.logger.warn('render() needs a render_mode given at construction ("rgb_array" or "human")')
            return None
        frame = draw_frame(self._world)
        if self.render_mode == "rgb_array":
            return frame
        if self._window is None:
            self._window = Window()
        self._window.show(frame)
        return None

    def close(self) -> None:
        """Closes the window, if one was opened."""
        if self._window is not None:
            self._window.close()
            self._window = None
