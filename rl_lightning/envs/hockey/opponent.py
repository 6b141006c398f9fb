"""The scripted hockey opponent of the course environment, seeded from its own generator."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rl_lightning.envs.hockey import constants as C

# PD gains; the strong opponent differs only in kp.
KP_WEAK = 0.5
KP_STRONG = 10.0
KD = 0.5
# Brake (damp with kd) on an axis once the target is closer than this many seconds at the current speed.
BRAKE_TIME = (0.1, 0.1, 1.0)
PHASE_STEP = 0.2
KICK_AHEAD = 0.2  # aims this far past the puck
KICK_LEAD = 0.1  # leads the puck's y-motion by dist * vy * this
SHOOT_BELOW = 7  # shoots once its hold counter is in (0, 7): about 9 steps after a catch


def _brake(error: float, velocity: float, horizon: float) -> bool:
    denominator = velocity + 0.01
    if denominator == 0.0:
        return False  # infinite time to target: no braking (numpy's division gives inf there)
    return abs(error / denominator) < horizon


def _clip(x: float) -> float:
    return 1.0 if x > 1.0 else (-1.0 if x < -1.0 else x)


class BasicOpponent:
    """Hand-written hockey player: PD control toward the puck or its own goal, racket angle wobbling.

    It acts on a player-1-frame observation; to play player 2 feed it ``env.obs_agent_two()``. Each call
    advances a phase by U(0, 0.2) from the opponent's own generator, so play is reproducible from ``seed``.

    Args:
        weak: gain kp = 0.5 (weak) or 10 (strong).
        seed: seed of the opponent's generator (int, ``SeedSequence`` or None for fresh entropy).
        keep_mode: whether the env lets players hold the puck (only then does it shoot).

    Example:
        >>> from rl_lightning.envs.hockey import BasicOpponent, HockeyEnv
        >>> env, opponent = HockeyEnv(), BasicOpponent(weak=False, seed=1)
        >>> obs, _ = env.reset(seed=0)
        >>> action2 = opponent.act(env.obs_agent_two())  # (4,) float32
    """

    def __init__(
        self, weak: bool = True, seed: int | np.random.SeedSequence | None = None, keep_mode: bool = True
    ) -> None:
        self.weak = weak
        self.keep_mode = keep_mode
        self.phase = 0.0
        self.seed(seed)

    def seed(self, seed: int | np.random.SeedSequence | None = None) -> None:
        """Restarts the generator from ``seed`` and draws a new starting phase in [0, pi)."""
        self.rng = np.random.default_rng(seed)
        self.phase = float(self.rng.uniform(0.0, math.pi))

    def act(self, obs: np.ndarray | Sequence[float]) -> np.ndarray:
        """Returns the (4,) float32 action ``[force x, force y, torque, shoot]`` for an 18-dim observation."""
        return np.array(self.act_values(obs), dtype=np.float32)

    __call__ = act

    def act_values(self, obs: np.ndarray | Sequence[float]) -> list[float]:
        """:meth:`act` as a list of Python floats."""
        o = obs.tolist() if isinstance(obs, np.ndarray) else list(obs)
        x, y, angle, vx, vy, w = o[0:6]
        px, py, pvx, pvy = o[12:16]
        # rng.random() * 0.2 is exactly what Generator.uniform(0, 0.2) computes from the same draw.
        self.phase += PHASE_STEP * self.rng.random()
        kp = KP_WEAK if self.weak else KP_STRONG

        if pvx < C.OPPONENT_REACH:
            # The puck comes toward us or drifts slowly: kick it if we are behind it, else get behind it.
            if x < px and abs(y - py) < C.OPPONENT_REACH:
                dist = math.sqrt((x - px) ** 2 + (y - py) ** 2)
                tx, ty = px + KICK_AHEAD, py + pvy * dist * KICK_LEAD
            else:
                tx, ty = C.OPPONENT_HOME_X, py
        else:
            tx, ty = C.OPPONENT_HOME_X, 0.0
        ta = C.MAX_ANGLE * math.sin(self.phase)

        ex, ey, ea = tx - x, ty - y, ta - angle
        ax = ex * kp - (vx * KD if _brake(ex, vx, BRAKE_TIME[0]) else 0.0)
        ay = ey * kp / 5 - (vy * KD if _brake(ey, vy, BRAKE_TIME[1]) else 0.0)
        aa = ea * kp / 2 - (w * KD if _brake(ea, w, BRAKE_TIME[2]) else 0.0)
        shoot = 1.0 if self.keep_mode and 0 < o[16] < SHOOT_BELOW else 0.0
        return [_clip(ax), _clip(ay), _clip(aa), shoot]
