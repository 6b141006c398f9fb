"""Scenarios: where the robots start and go, the vortex cores and the static obstacles of one episode."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_lightning.envs.marinenav import constants as C


@dataclass(frozen=True)
class Scenario:
    """One episode's layout.

    Attributes:
        starts: ``(n, 2)`` robot start positions.
        goals: ``(n, 2)`` robot goals.
        headings: ``(n,)`` initial headings in ``[0, 2π)``.
        obstacles: ``(k, 3)`` static obstacles as ``(x, y, radius)``.
        cores: ``(c, 4)`` vortex cores as ``(x, y, clockwise (0/1), circulation Γ)``.
    """

    starts: np.ndarray
    goals: np.ndarray
    headings: np.ndarray
    obstacles: np.ndarray
    cores: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.starts)
        if n == 0:
            raise ValueError("a scenario needs at least one robot")
        shapes = {
            "starts": (self.starts.shape, (n, 2)),
            "goals": (self.goals.shape, (n, 2)),
            "headings": (self.headings.shape, (n,)),
        }
        for name, (got, want) in shapes.items():
            if got != want:
                raise ValueError(f"scenario {name} has shape {got}, expected {want}")
        if self.obstacles.ndim != 2 or self.obstacles.shape[1] != 3:
            raise ValueError(f"scenario obstacles must be (k, 3) rows of x, y, r, got {self.obstacles.shape}")
        if self.cores.ndim != 2 or self.cores.shape[1] != 4:
            raise ValueError(
                f"scenario cores must be (c, 4) rows of x, y, clockwise, Γ, got {self.cores.shape}"
            )

    @property
    def num_robots(self) -> int:
        return len(self.starts)

    @classmethod
    def make(
        cls,
        starts: Any,
        goals: Any,
        headings: Any,
        obstacles: Any = (),
        cores: Any = (),
    ) -> Scenario:
        """Builds a scenario from sequences (lists, tuples, arrays); empty obstacles and cores allowed."""
        return cls(
            starts=np.asarray(starts, dtype=np.float64).reshape(-1, 2),
            goals=np.asarray(goals, dtype=np.float64).reshape(-1, 2),
            headings=np.asarray(headings, dtype=np.float64).reshape(-1),
            obstacles=np.asarray(obstacles, dtype=np.float64).reshape(-1, 3),
            cores=np.asarray(cores, dtype=np.float64).reshape(-1, 4),
        )

    @classmethod
    def from_public(cls, episode: dict[str, Any]) -> Scenario:
        """Reads the public env's episode record (``MarineNavEnv3.episode_data()``, its eval configs)."""
        env, robots = episode["env"], episode["robots"]
        obstacles = [
            (*p, r) for p, r in zip(env["obstacles"]["positions"], env["obstacles"]["r"], strict=True)
        ]
        cores = [
            (*p, float(cw), g)
            for p, cw, g in zip(
                env["cores"]["positions"], env["cores"]["clockwise"], env["cores"]["Gamma"], strict=True
            )
        ]
        return cls.make(robots["start"], robots["goal"], robots["init_theta"], obstacles, cores)


def generate(rng: np.random.Generator, level: C.Level) -> Scenario:
    """Draws a scenario by the public env's rejection rules (``docs/marinenav.md`` section 1).

    Robots, then cores, then obstacles, each from a budget of ``MAX_DRAWS`` candidates drawn in one block; a
    candidate is accepted if it keeps its distances to what was accepted before it. As in the public env, a
    budget that runs out leaves fewer objects than asked (robots: rare at 5 robots and 40 m).
    """
    lo, hi = C.START_GOAL_MARGIN, C.MAP_SIZE - C.START_GOAL_MARGIN
    starts: list[np.ndarray] = []
    goals: list[np.ndarray] = []
    if level.num_robots > 0:
        candidates = rng.uniform(lo, hi, size=(C.MAX_DRAWS, 2, 2))
        for start, goal in candidates:
            if np.linalg.norm(goal - start) < level.min_start_goal_dis:
                continue
            if starts and (
                np.min(np.linalg.norm(np.asarray(starts) - start, axis=1)) <= C.CLEAR_R
                or np.min(np.linalg.norm(np.asarray(goals) - goal, axis=1)) <= C.CLEAR_R
            ):
                continue
            starts.append(start)
            goals.append(goal)
            if len(starts) == level.num_robots:
                break
    if not starts:
        raise RuntimeError(f"no robot placed in {C.MAX_DRAWS} draws for {level}")
    ends = np.concatenate([np.asarray(starts), np.asarray(goals)])
    headings = rng.uniform(0.0, 2.0 * math.pi, size=len(starts))

    cores: list[tuple[float, float, float, float]] = []
    if level.num_cores > 0:
        centres = rng.uniform(0.0, C.MAP_SIZE, size=(C.MAX_DRAWS, 2))
        clockwise = rng.random(C.MAX_DRAWS) < 0.5
        gammas = 2.0 * math.pi * C.CORE_R * rng.uniform(*C.CORE_EDGE_SPEED, size=C.MAX_DRAWS)
        for centre, cw, gamma in zip(centres, clockwise, gammas, strict=True):
            if _core_fits(centre, bool(cw), float(gamma), ends, cores):
                cores.append((centre[0], centre[1], float(cw), float(gamma)))
                if len(cores) == level.num_cores:
                    break

    obstacles: list[tuple[float, float, float]] = []
    if level.num_obstacles > 0:
        centres = rng.uniform(C.OBSTACLE_MARGIN, C.MAP_SIZE - C.OBSTACLE_MARGIN, size=(C.MAX_DRAWS, 2))
        radii = rng.uniform(*C.OBSTACLE_R, size=C.MAX_DRAWS)
        for centre, r in zip(centres, radii, strict=True):
            if _obstacle_fits(centre, float(r), ends, cores, obstacles):
                obstacles.append((centre[0], centre[1], float(r)))
                if len(obstacles) == level.num_obstacles:
                    break
    return Scenario.make(starts, goals, headings, obstacles, cores)


def _core_fits(centre: np.ndarray, cw: bool, gamma: float, ends: np.ndarray, cores: list) -> bool:
    """The public ``check_core``: inside the map, clear of starts and goals, currents that meet gently."""
    if np.any(centre - C.CORE_R < 0.0) or np.any(centre + C.CORE_R > C.MAP_SIZE):
        return False
    if np.min(np.linalg.norm(ends - centre, axis=1)) < C.CORE_R + C.CLEAR_R:
        return False
    for x, y, other_cw, other_gamma in cores:
        dis = math.hypot(x - centre[0], y - centre[1])
        if bool(other_cw) == cw:
            # Same direction: the currents run against each other between the cores.
            if dis < (other_gamma + gamma) / (2.0 * math.pi * C.V_REL_MAX):
                return False
        else:
            # Opposite directions: the stronger one's current at the weaker one's rim stays below p of the
            # weaker one's own rim speed.
            strong, weak = max(other_gamma, gamma), min(other_gamma, gamma)
            if strong / (2.0 * math.pi * (dis - 2.0 * C.CORE_R)) > C.P_RATIO * weak / (
                2.0 * math.pi * C.CORE_R
            ):
                return False
    return True


def _obstacle_fits(centre: np.ndarray, r: float, ends: np.ndarray, cores: list, obstacles: list) -> bool:
    """The public ``check_obstacle``: inside the map, clear of starts, goals, cores and other obstacles."""
    if np.any(centre - r < 0.0) or np.any(centre + r > C.MAP_SIZE):
        return False
    if np.min(np.linalg.norm(ends - centre, axis=1)) < r + C.CLEAR_R:
        return False
    for x, y, _, _ in cores:
        if math.hypot(x - centre[0], y - centre[1]) <= C.CORE_R + r:
            return False
    return all(math.hypot(x - centre[0], y - centre[1]) > other_r + r for x, y, other_r in obstacles)
