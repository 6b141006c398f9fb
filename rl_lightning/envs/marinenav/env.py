"""Marine navigation as a gymnasium env: one scenario, every robot slot acting in one step."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rl_lightning.envs.marinenav import constants as C
from rl_lightning.envs.marinenav.core import MarineNavBatch
from rl_lightning.envs.marinenav.render import draw_frame
from rl_lightning.envs.marinenav.scenario import Scenario


def resolve_schedule(schedule: str | dict | C.Schedule | None) -> C.Schedule | None:
    """``"paper"`` (the public training schedule), a public-config dict, a :class:`Schedule` or ``None``."""
    if schedule is None or isinstance(schedule, C.Schedule):
        return schedule
    if isinstance(schedule, str):
        if schedule != "paper":
            raise ValueError(f"unknown marine-navigation schedule {schedule!r}; use 'paper', a dict or None")
        return C.PAPER_SCHEDULE
    if isinstance(schedule, dict):
        return C.Schedule.from_dict(schedule)
    raise TypeError(f"schedule must be 'paper', a dict, a Schedule or None, got {type(schedule).__name__}")


def resolve_levels(
    schedule: str | dict | C.Schedule | None,
    num_robots: int | None = None,
    num_cores: int | None = None,
    num_obstacles: int | None = None,
    min_start_goal_dis: float | None = None,
    max_robots: int | None = None,
) -> tuple[C.Schedule | None, C.Level | None, int]:
    """``(schedule, fixed level, robot slots)`` of an env's arguments (see :class:`MarineNavEnv`).

    Exactly one of the schedule and the fixed level is set; the robot slots default to the most robots
    any level asks for.

    Raises:
        ValueError: a fixed-level count with a schedule, negative counts, or too few robot slots.
    """
    resolved = resolve_schedule(schedule)
    fixed = {"num_robots": num_robots, "num_cores": num_cores, "num_obstacles": num_obstacles}
    fixed["min_start_goal_dis"] = min_start_goal_dis
    fixed_level = None
    if resolved is not None:
        given = [k for k, v in fixed.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} set with a schedule; pass schedule=None for a fixed level")
        levels = resolved.levels
    else:
        d = C.DEFAULT_LEVEL
        fixed_level = C.Level(
            int(d.num_robots if num_robots is None else num_robots),
            int(d.num_cores if num_cores is None else num_cores),
            int(d.num_obstacles if num_obstacles is None else num_obstacles),
            float(d.min_start_goal_dis if min_start_goal_dis is None else min_start_goal_dis),
        )
        if fixed_level.num_robots < 1 or fixed_level.num_cores < 0 or fixed_level.num_obstacles < 0:
            raise ValueError(f"need num_robots >= 1 and no negative counts, got {fixed_level}")
        levels = (fixed_level,)
    most = max(lv.num_robots for lv in levels)
    slots = most if max_robots is None else int(max_robots)
    if slots < most:
        raise ValueError(f"max_robots={slots} is below the {most} robots a level asks for")
    return resolved, fixed_level, slots


class MarineNavEnv(gym.Env):
    """Several surface vessels, each navigating to its own goal among the others and static obstacles.

    An observation is ``(max_robots, 37)`` float32: one row per robot slot (``self 7 | objects 5x5 | mask 5``,
    see :func:`~rl_lightning.envs.marinenav.core.split_observation`), zero for slots the episode does not use
    or whose robot has stopped. An action is one row per slot (25 discrete thrust changes, or ``[-1, 1]²``
    with ``continuous=True``); rows of stopped or absent robots are ignored. The reward is the sum over
    robots (gymnasium wants a scalar); ``info`` carries the per-robot view:

    - ``agent_reward (R,)``, ``agent_terminated (R,)`` (collided or reached its goal in this step),
      ``agent_truncated (R,)`` (running at the timeout step);
    - ``present``, ``active`` (after the step), ``outcome`` (0 running, 1 goal, 2 collision, 3 timeout),
      ``reached``, ``collided``, ``energy``, ``travel_time``, ``path_length``, all ``(R,)``;
    - ``success``: every robot of the episode reached its goal; ``level``: the curriculum row.

    ``terminated`` when every robot has stopped (or, with ``end_on_collision``, at the first collision, the
    public evaluation's rule); ``truncated`` at the 1001st step.

    Args:
        continuous: continuous actions (AC-IQN, DDPG, SAC) instead of 25 discrete ones (DQN, IQN, Rainbow).
        schedule: the curriculum read at each reset from this env's step count (``"paper"``: 3 to 5 robots,
            0 to 4 obstacles, 30 to 40 m over 6M steps), or ``None`` for a fixed level.
        num_robots, num_cores, num_obstacles, min_start_goal_dis: the fixed level when ``schedule`` is
            ``None`` (defaults: the public env's 6, 8, 8, 30).
        max_robots: robot slots (default: the most any level asks for).
        perception_noise: the public env's noisy perception; ``False`` for exact replays.
        end_on_collision: end the episode at the first collision (the public evaluation's rule).
        render_mode: ``"rgb_array"``: :meth:`render` draws the vessels, their goals and tracks, the
            obstacles and the currents (:func:`~rl_lightning.envs.marinenav.render.draw_frame`).

    ``reset(options=...)`` accepts ``scenario`` (a :class:`Scenario` or a public episode record) or ``level``
    (an index into the schedule, or a :class:`~rl_lightning.envs.marinenav.constants.Level`).

    Example:
        >>> env = MarineNavEnv(schedule=None, num_robots=3, num_cores=0, num_obstacles=2)
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape, int(info["present"].sum())
        ((3, 37), 3)
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 2}

    def __init__(
        self,
        *,
        continuous: bool = False,
        schedule: str | dict | C.Schedule | None = "paper",
        num_robots: int | None = None,
        num_cores: int | None = None,
        num_obstacles: int | None = None,
        min_start_goal_dis: float | None = None,
        max_robots: int | None = None,
        perception_noise: bool = True,
        end_on_collision: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self._tracks: list[np.ndarray] = []
        self.schedule, self.fixed_level, self.max_robots = resolve_levels(
            schedule, num_robots, num_cores, num_obstacles, min_start_goal_dis, max_robots
        )
        levels = self.schedule.levels if self.schedule is not None else (self.fixed_level,)
        self.continuous = continuous
        self.sim = MarineNavBatch(
            1,
            self.max_robots,
            max(lv.num_obstacles for lv in levels),
            max(lv.num_cores for lv in levels),
            continuous=continuous,
            perception_noise=perception_noise,
            end_on_collision=end_on_collision,
        )
        R = self.max_robots
        self.observation_space = spaces.Box(-np.inf, np.inf, (R, C.OBS_DIM), np.float32)
        if continuous:
            self.action_space: spaces.Space = spaces.Box(-1.0, 1.0, (R, 2), np.float32)
        else:
            self.action_space = spaces.MultiDiscrete(np.full(R, C.N_DISCRETE_ACTIONS))
        self.total_steps = 0
        self.level_index = 0
        self._done = True

    def _level(self, option: Any) -> C.Level:
        if isinstance(option, C.Level):
            return option
        if self.schedule is None:
            if option is not None:
                raise ValueError("the level option needs a schedule (or pass a Level)")
            return self.fixed_level  # type: ignore[return-value]
        index = self.schedule.level_index(self.total_steps) if option is None else int(option)
        if not 0 <= index < len(self.schedule.levels):
            raise ValueError(f"level {index} is not in the schedule's {len(self.schedule.levels)} levels")
        self.level_index = index
        return self.schedule.levels[index]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Starts an episode: a scenario drawn from the env's generator, or the one given in ``options``."""
        super().reset(seed=seed)
        self.sim.rngs = [self.np_random]
        options = dict(options or {})
        scenario = options.pop("scenario", None)
        level_option = options.pop("level", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; use scenario or level")
        if scenario is not None and not isinstance(scenario, Scenario):
            scenario = Scenario.from_public(scenario)
        level = None if scenario is not None else self._level(level_option)
        obs = self.sim.reset([scenario], level)
        self._done = False
        self._tracks = []
        return obs[0], self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("the episode has ended; call reset() before step()")
        if self.render_mode is not None:
            self._tracks.append(self.sim.pos[0].copy())
        result = self.sim.step(np.asarray(action)[None])
        self.total_steps += 1
        terminated, truncated = bool(result.env_terminated[0]), bool(result.env_truncated[0])
        self._done = terminated or truncated
        info = self._info()
        info["agent_reward"] = result.reward[0]
        info["agent_terminated"] = result.terminated[0]
        info["agent_truncated"] = result.truncated[0]
        return result.obs[0], float(result.reward[0].sum()), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The current frame ``(440, 440, 3)`` uint8 with ``render_mode="rgb_array"`` (else ``None``)."""
        if self.render_mode is None:
            return None
        return draw_frame(self.sim, 0, tracks=self._tracks)

    def _info(self) -> dict[str, Any]:
        info = {k: v[0] for k, v in self.sim.info().items()}
        info["success"] = bool(np.all(info["reached"][info["present"]]))
        info["level"] = self.level_index
        return info
