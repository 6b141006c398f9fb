"""Numbers of the laser-hockey rink, its physics and its rewards, and the game modes.

Lengths are metres (the rink is drawn at ``SCALE`` pixels per metre), world coordinates have their origin at
the bottom-left corner of the 600x480 px viewport, times are seconds. Most values are stated in pixels in the
course environment; they are kept here in that form where it makes the geometry easier to check.
"""

from __future__ import annotations

import enum
import math

FPS = 50
DT = 1.0 / FPS
VELOCITY_ITERATIONS = 180
POSITION_ITERATIONS = 60

SCALE = 60.0
VIEWPORT_W = 600
VIEWPORT_H = 480
W = VIEWPORT_W / SCALE
H = VIEWPORT_H / SCALE
CENTER_X = W / 2
CENTER_Y = H / 2
ZONE = W / 20
MAX_ANGLE = math.pi / 3
GOAL_SIZE = 75

# Player 1's racket in pixels before RACKET_FACTOR; +x is the flat face toward the opponent.
RACKET_POLY_PX = ((-10, 20), (5, 20), (5, -20), (-10, -20), (-18, -10), (-21, 0), (-18, 10))
RACKET_FACTOR = 1.2
PLAYER_DENSITY = 200.0 / RACKET_FACTOR
PLAYER_FRICTION = 1.0

PUCK_RADIUS = 13 / SCALE
PUCK_DENSITY = 7.0
PUCK_FRICTION = 0.1
PUCK_RESTITUTION = 0.95
WALL_FRICTION = 0.1

FORCE_MULTIPLIER = 6000.0
TORQUE_MULTIPLIER = 400.0
SHOOT_SPEED = 60.0  # the shot's instantaneous speed change in m/s
MAX_PLAYER_SPEED = 10.0
MAX_PUCK_SPEED = 25.0
MAX_TIME_KEEP_PUCK = 15
SHOOT_THRESHOLD = 0.5

# Linear damping per regime; Box2D 2.3 multiplies the velocity by (1 - DT * damping) every step.
PLAYER_DAMPING = 5.0
PLAYER_DAMPING_BRAKE = 20.0
PLAYER_ANGULAR_DAMPING = 2.0
PLAYER_ANGULAR_DAMPING_LIMIT = 10.0
PUCK_DAMPING = 0.05
PUCK_DAMPING_FAST = 10.0

# Player 1 may not push left of this x nor right of CENTER_X; player 2 mirrored. Same for y in both halves.
PLAYER_X_MIN = W / 2 - 210 / SCALE
PLAYER_X_MAX = W / 2 + 210 / SCALE
PLAYER_Y_MIN = 1.2
PLAYER_Y_MAX = H - 1.2

# Collision categories: walls collide with players and puck, goals' sensor with the puck only and goals'
# solid part with the players only.
CAT_PUCK = 0x0001
CAT_PLAYER = 0x0010
CAT_WALL = 0x0011
CAT_GOAL = 0x0010
MASK_PUCK = 0x0010
MASK_PLAYER = 0x0011
MASK_WALL = 0x0011
MASK_GOAL_SENSOR = 0x0001
MASK_GOAL_SOLID = 0x0010

# Goals sit just outside the side walls' mouths, centred on the rink's horizontal axis.
GOAL_HALF_W = 10 / SCALE
GOAL_HALF_H = GOAL_SIZE / SCALE
GOAL_LEFT_X = W / 2 - 245 / SCALE - 10 / SCALE
GOAL_RIGHT_X = W / 2 + 245 / SCALE + 10 / SCALE

# Player start positions (world).
PLAYER1_START = (W / 5, H / 2)
PLAYER2_START = (4 * W / 5, H / 2)

NORMAL_MAX_TIMESTEPS = 250
TRAINING_MAX_TIMESTEPS = 80

# Rewards.
WIN_REWARD = 10.0
CLOSENESS_MAX_DIST = 250.0 / SCALE
CLOSENESS_MAX_REWARD = -30.0

# BasicOpponent's defence line and reach, in the player-1 frame (relative to the centre).
OPPONENT_HOME_X = -210 / SCALE
OPPONENT_REACH = 30.0 / SCALE


class Mode(enum.IntEnum):
    """Game mode: who starts where, and how long an episode lasts."""

    NORMAL = 0
    TRAIN_SHOOTING = 1
    TRAIN_DEFENSE = 2

    @classmethod
    def coerce(cls, value: Mode | str | int) -> Mode:
        """Returns the mode given as a member, a name (any case) or an integer value.

        Raises:
            ValueError: for an unknown name or value.
            TypeError: for any other type (``bool`` included, which would otherwise pass as 0/1).
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                names = ", ".join(m.name for m in cls)
                raise ValueError(f"unknown hockey mode {value!r}; use one of {names}") from None
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"unknown hockey mode value {value}; use 0, 1 or 2") from None
        raise TypeError(f"hockey mode must be a Mode, a name or an int, got {type(value).__name__}")

    @property
    def max_timesteps(self) -> int:
        """The original's ``max_timesteps``; an episode that times out lasts one step more than this."""
        return NORMAL_MAX_TIMESTEPS if self is Mode.NORMAL else TRAINING_MAX_TIMESTEPS
