"""Numbers of the marine-navigation env: map, currents, the WAM-V 16 vessel model, perception, rewards.

All values are those of the public env (Lin et al., RA-L 2025; ``docs/marinenav.md`` lists them with
their sources). Lengths in metres, times in seconds, forces in newtons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Map and scenario generation.
MAP_SIZE = 55.0
START_GOAL_MARGIN = 2.0  # starts and goals are drawn in [2, 53]^2
OBSTACLE_MARGIN = 5.0  # obstacle centres are drawn in [5, 50]^2
CLEAR_R = 10.0  # no other start (goal), core or obstacle this close to a start (goal)
MAX_DRAWS = 500  # rejection-sampling budget per kind of object and scenario

# Vortex cores (Rankine vortices).
CORE_R = 0.5
CORE_EDGE_SPEED = (3.0, 3.0)  # uniform range of the speed at the core's rim
V_REL_MAX = 1.0  # max speed where two same-direction vortices' currents meet
P_RATIO = 0.8  # max relative speed at another core, opposite directions

OBSTACLE_R = (1.0, 1.0)  # uniform range of static obstacle radii

# Time.
DT = 0.05
SUBSTEPS = 10  # one action lasts SUBSTEPS * DT = 0.5 s
ACTION_DURATION = DT * SUBSTEPS
MAX_EPISODE_STEPS = 1001  # the step taken after 1000 steps is the last

# Thrust.
MIN_THRUST = -500.0
MAX_THRUST = 1000.0
THRUST_CHANGES = (0.0, -500.0, -1000.0, 500.0, 1000.0)  # N/s per thruster, discrete actions
CONTINUOUS_THRUST_CHANGE = 1000.0  # N/s per unit of continuous action
N_DISCRETE_ACTIONS = len(THRUST_CHANGES) ** 2
# Discrete action a = 5 * i + j -> (left, right) thrust change (THRUST_CHANGES[i], THRUST_CHANGES[j]).
DISCRETE_THRUST_CHANGES = np.array(
    [(lt, rt) for lt in THRUST_CHANGES for rt in THRUST_CHANGES], dtype=np.float64
)

# Perception.
PERCEPTION_RANGE = 20.0
MAX_OBJECTS = 5
POS_STD = 0.05
VEL_STD = 0.05
R_KAPPA = 1.0
R_MEAN_RATIO = 0.8
SELF_DIM = 7  # goal (2), velocity (2), angular velocity, left thrust, right thrust
OBJECT_DIM = 5  # position (2), velocity (2), radius
OBS_DIM = SELF_DIM + MAX_OBJECTS * OBJECT_DIM + MAX_OBJECTS  # self | objects | mask = 37

# Goal, COLREGs and rewards.
GOAL_DIS = 2.0
COLREGS_MIN_SPEED = 0.5  # both vessels must move at least this fast for a COLREGs relationship
HEAD_ON_X = 17.0
HEAD_ON_Y = 9.0
LEFT_CROSSING_X = (-9.0, 12.0)
LEFT_CROSSING_Y = (-17.0, -7.0)
COLREGS_MARGIN = 1.0  # added to the other vessel's radius for the desired passing direction
TIMESTEP_PENALTY = -0.1
COLREGS_PENALTY = -0.1
COLLISION_PENALTY = -5.0
GOAL_REWARD = 10.0

# Outcome codes per robot.
RUNNING, GOAL, COLLISION, TIMEOUT = 0, 1, 2, 3


@dataclass(frozen=True)
class VesselParams:
    """The WAM-V 16 model: size, mass, the hydrodynamic derivatives of Fossen's 3-DOF model.

    Derivatives that are 0 in the public model are kept so the formulas stay those of the model.
    """

    length: float = 5.0
    width: float = 2.5
    m: float = 400.0
    izz: float = 450.0
    x_udot: float = 20.0
    y_vdot: float = 0.0
    y_rdot: float = 0.0
    n_rdot: float = -980.0
    n_vdot: float = 0.0
    x_u: float = -100.0
    x_uu: float = -150.0
    y_v: float = -100.0
    y_vv: float = -150.0
    y_r: float = 0.0
    y_rv: float = 0.0
    y_vr: float = 0.0
    y_rr: float = 0.0
    n_r: float = -980.0
    n_rr: float = -950.0
    n_v: float = 0.0
    n_vv: float = 0.0
    n_rv: float = 0.0
    n_vr: float = 0.0

    @property
    def radius(self) -> float:
        """Collision and detection radius: half the hull's diagonal (about 2.795 m)."""
        return 0.5 * math.hypot(self.length, self.width)

    def acceleration_matrix(self) -> np.ndarray:
        """``(MᵀM)⁻¹Mᵀ`` with ``M`` the rigid-body plus added mass: maps the force vector to accelerations."""
        mass = np.diag([self.m, self.m, self.izz]) - np.array(
            [[self.x_udot, 0.0, 0.0], [0.0, self.y_vdot, self.y_rdot], [0.0, self.n_vdot, self.n_rdot]]
        )
        return np.linalg.inv(mass.T @ mass) @ mass.T


@dataclass(frozen=True)
class Level:
    """One row of a curriculum: what a scenario holds."""

    num_robots: int
    num_cores: int
    num_obstacles: int
    min_start_goal_dis: float


@dataclass(frozen=True)
class Schedule:
    """A curriculum: ``levels[i]`` applies from env step ``timesteps[i]`` on (``timesteps[0]`` is 0)."""

    timesteps: tuple[int, ...]
    levels: tuple[Level, ...]

    def __post_init__(self) -> None:
        if len(self.timesteps) != len(self.levels) or not self.levels:
            raise ValueError("a schedule needs one level per start step, and at least one")
        if self.timesteps[0] != 0 or list(self.timesteps) != sorted(self.timesteps):
            raise ValueError(f"schedule steps must start at 0 and increase, got {self.timesteps}")

    def level_index(self, steps: int) -> int:
        """The row that applies after ``steps`` env steps: the last one whose start is ``<= steps``."""
        return int(np.searchsorted(np.asarray(self.timesteps), steps, side="right")) - 1

    @classmethod
    def from_dict(cls, raw: dict) -> Schedule:
        """Reads the public configs' ``training_schedule`` layout (parallel lists)."""
        rows = zip(
            raw["num_robots"], raw["num_cores"], raw["num_obstacles"], raw["min_start_goal_dis"], strict=True
        )
        return cls(
            tuple(int(t) for t in raw["timesteps"]),
            tuple(Level(int(a), int(b), int(c), float(d)) for a, b, c, d in rows),
        )


# The one schedule of all six public training configs (6M steps): 3-5 robots, no cores, 0-4 obstacles.
PAPER_SCHEDULE = Schedule(
    timesteps=(0, 1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000),
    levels=(
        Level(3, 0, 0, 30.0),
        Level(4, 0, 0, 35.0),
        Level(5, 0, 0, 40.0),
        Level(5, 0, 2, 40.0),
        Level(5, 0, 3, 40.0),
        Level(5, 0, 4, 40.0),
    ),
)
# The public evaluation: 10 scenarios per level, generated once by an env seeded with EVAL_SEED.
EVAL_EPISODES_PER_LEVEL = 10
EVAL_SEED = 253
# The env's defaults without a schedule.
DEFAULT_LEVEL = Level(num_robots=6, num_cores=8, num_obstacles=8, min_start_goal_dis=30.0)
