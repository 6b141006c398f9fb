"""The marine-navigation simulation, vectorized over envs and robots (NumPy, float64 state).

``MarineNavBatch`` holds ``num_envs`` scenarios with up to ``max_robots`` robots each; a ``present`` mask says
which robot slots an episode uses and an ``active`` mask which of them still run. A step moves, perceives,
checks and rewards every robot of every env with array operations: there is no Python loop over robots or
envs (the loop over the action's 10 sub-steps is over time). Resets loop over rejection-sampling draws.

The behaviour is the public env's (``docs/marinenav.md``); the per-robot deactivation the public trainer
does after a step is done here, so a robot's ``done`` is the env's own output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl_lightning.envs.marinenav import constants as C
from rl_lightning.envs.marinenav.scenario import Scenario, generate

TWO_PI = 2.0 * math.pi


@dataclass
class StepResult:
    """What one batched step returns; arrays are ``(E, R)`` unless said otherwise.

    Attributes:
        obs: ``(E, R, 37)`` float32 observations; zero rows for robots that were not active at the step.
        reward: float64 rewards; 0 for robots that were not active.
        terminated: robots that collided or reached their goal in this step (not at the timeout step).
        truncated: robots still running at the timeout step.
        outcome: ``RUNNING``, ``GOAL``, ``COLLISION`` or ``TIMEOUT`` per robot (kept after the robot stops).
        env_terminated: ``(E,)`` every present robot stopped (or, with ``end_on_collision``, any collided).
        env_truncated: ``(E,)`` the timeout step, unless the env terminated in it.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    outcome: np.ndarray
    env_terminated: np.ndarray
    env_truncated: np.ndarray


def wrap_to_pi(angle: np.ndarray) -> np.ndarray:
    """Wraps angles into ``[-π, π)``; NaN stays NaN."""
    return angle - TWO_PI * np.floor((angle + math.pi) / TWO_PI)


def split_observation(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Splits ``(..., 37)`` rows into ``self (..., 7)``, ``objects (..., 5, 5)`` and ``mask (..., 5)``.

    These are the three inputs of the public TorchScript policies (nearest object first, zero padding).
    """
    lead = obs.shape[:-1]
    objects = obs[..., C.SELF_DIM : C.SELF_DIM + C.MAX_OBJECTS * C.OBJECT_DIM].reshape(
        *lead, C.MAX_OBJECTS, C.OBJECT_DIM
    )
    return obs[..., : C.SELF_DIM], objects, obs[..., C.OBS_DIM - C.MAX_OBJECTS :]


class MarineNavBatch:
    """``num_envs`` marine-navigation envs stepped together.

    Args:
        num_envs: envs side by side (E).
        max_robots: robot slots per env (R); an episode may use fewer (``present``).
        max_obstacles: static obstacle slots per env (K).
        max_cores: vortex core slots per env.
        continuous: actions are ``(E, R, 2)`` in ``[-1, 1]`` (thrust change per second / 1000) instead of
            ``(E, R)`` integers in ``[0, 25)``.
        perception_noise: the public env's noisy positions, velocities and radii; ``False`` sees exact
            positions and velocities and the full radius (for replays against the public env).
        end_on_collision: the public evaluation's rule: an env's episode ends at its first collision.
        vessel: the vessel model (one for all robots, as in the public env).

    State arrays (world frame, float64): ``pos (E, R, 2)``, ``theta (E, R)``, ``vel_r (E, R, 3)`` (relative to
    the water: vx, vy, angular rate), ``vel (E, R, 3)`` (over ground, as of the last sub-step's start, what
    perception reads), ``thrust (E, R, 2)`` (left, right), ``start``, ``goal``; flags ``present``, ``active``,
    ``collided``, ``reached``; per-robot ``energy``, ``travel_time``, ``path_length``; ``steps (E,)``.
    """

    def __init__(
        self,
        num_envs: int,
        max_robots: int,
        max_obstacles: int,
        max_cores: int,
        *,
        continuous: bool = False,
        perception_noise: bool = True,
        end_on_collision: bool = False,
        vessel: C.VesselParams | None = None,
    ) -> None:
        if num_envs < 1 or max_robots < 1 or max_obstacles < 0 or max_cores < 0:
            raise ValueError(
                f"need num_envs >= 1, max_robots >= 1, max_obstacles >= 0, max_cores >= 0; got "
                f"{num_envs}, {max_robots}, {max_obstacles}, {max_cores}"
            )
        self.num_envs, self.max_robots = num_envs, max_robots
        self.max_obstacles, self.max_cores = max_obstacles, max_cores
        self.continuous = continuous
        self.perception_noise = perception_noise
        self.end_on_collision = end_on_collision
        self.vessel = vessel or C.VesselParams()
        self.radius = self.vessel.radius
        self._acc = self.vessel.acceleration_matrix()
        E, R, K, Q = num_envs, max_robots, max_obstacles, max_cores
        self.present = np.zeros((E, R), dtype=bool)
        self.active = np.zeros((E, R), dtype=bool)
        self.collided = np.zeros((E, R), dtype=bool)
        self.reached = np.zeros((E, R), dtype=bool)
        self.outcome = np.zeros((E, R), dtype=np.int8)
        self.pos = np.zeros((E, R, 2))
        self.theta = np.zeros((E, R))
        self.vel_r = np.zeros((E, R, 3))
        self.vel = np.zeros((E, R, 3))
        self.thrust = np.zeros((E, R, 2))
        self.start = np.zeros((E, R, 2))
        self.goal = np.zeros((E, R, 2))
        self.energy = np.zeros((E, R))
        self.travel_time = np.zeros((E, R))
        self.path_length = np.zeros((E, R))
        self.colregs = np.zeros((E, R), dtype=bool)
        self.phi = np.zeros((E, R))
        self.obstacle_present = np.zeros((E, K), dtype=bool)
        self.obstacle_pos = np.zeros((E, K, 2))
        self.obstacle_r = np.zeros((E, K))
        self.core_present = np.zeros((E, Q), dtype=bool)
        self.core_pos = np.zeros((E, Q, 2))
        self.core_clockwise = np.zeros((E, Q), dtype=bool)
        self.core_gamma = np.zeros((E, Q))
        self.steps = np.zeros(E, dtype=np.int64)
        self.rngs: list[np.random.Generator] = [np.random.default_rng() for _ in range(E)]

    # ------------------------------------------------------------------ reset
    def seed(self, seeds: Sequence[int | None] | int | None) -> None:
        """Reseeds the envs' generators: one seed for all (spawned per env) or one per env."""
        if seeds is None or isinstance(seeds, int):
            children = np.random.SeedSequence(seeds).spawn(self.num_envs)
            self.rngs = [np.random.default_rng(s) for s in children]
        else:
            if len(seeds) != self.num_envs:
                raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs")
            self.rngs = [np.random.default_rng(s) for s in seeds]

    def reset_env(self, i: int, scenario: Scenario | None = None, level: C.Level | None = None) -> np.ndarray:
        """Puts env ``i`` at the start of ``scenario`` (or of one drawn from its generator for ``level``).

        Returns env ``i``'s first observation ``(R, 37)``. Its perception also sets the goal and collision
        flags of a robot that starts within reach, as the public env's reset does (the rewards then come
        with the first step). Only env ``i``'s generator is drawn from, so the other envs' episodes do not
        depend on when env ``i`` is reset.
        """
        if scenario is None:
            if level is None:
                raise ValueError("reset_env needs a scenario or a level to draw one from")
            scenario = generate(self.rngs[i], level)
        n, k, q = scenario.num_robots, len(scenario.obstacles), len(scenario.cores)
        if n > self.max_robots or k > self.max_obstacles or q > self.max_cores:
            raise ValueError(
                f"scenario has {n} robots, {k} obstacles, {q} cores; the env holds at most "
                f"{self.max_robots}, {self.max_obstacles}, {self.max_cores}"
            )
        for arr in (
            self.present,
            self.active,
            self.collided,
            self.reached,
            self.colregs,
            self.obstacle_present,
        ):
            arr[i] = False
        for arr in (
            self.outcome,
            self.pos,
            self.theta,
            self.vel_r,
            self.vel,
            self.thrust,
            self.start,
            self.goal,
        ):
            arr[i] = 0
        for arr in (self.energy, self.travel_time, self.path_length, self.phi, self.core_present):
            arr[i] = 0
        self.present[i, :n] = True
        self.active[i, :n] = True
        self.start[i, :n] = scenario.starts
        self.goal[i, :n] = scenario.goals
        self.pos[i, :n] = scenario.starts
        self.theta[i, :n] = scenario.headings
        self.obstacle_present[i, :k] = True
        self.obstacle_pos[i, :k] = scenario.obstacles[:, :2]
        self.obstacle_r[i, :k] = scenario.obstacles[:, 2]
        self.core_present[i, :q] = True
        self.core_pos[i, :q] = scenario.cores[:, :2]
        self.core_clockwise[i, :q] = scenario.cores[:, 2] > 0.5
        self.core_gamma[i, :q] = scenario.cores[:, 3]
        self.steps[i] = 0
        # At rest relative to the water: the over-ground velocity is the current at the start.
        self.vel[i, :, :2] = self._current_at(self.pos)[i]
        observers = np.zeros_like(self.active)
        observers[i] = self.active[i]
        obs, collided, reached, *_ = self._perceive(observers)
        self.collided[i] |= collided[i]
        self.reached[i] |= reached[i]
        return obs[i]

    def observe(self) -> np.ndarray:
        """``(E, R, 37)`` observations of the current state (perception noise drawn anew); no checks."""
        obs, *_ = self._perceive(self.active)
        return obs

    def reset(
        self, scenarios: Sequence[Scenario | None] | None = None, level: C.Level | None = None
    ) -> np.ndarray:
        """Resets every env (from ``scenarios[i]`` or a draw for ``level``); returns ``(E, R, 37)``."""
        return np.stack(
            [
                self.reset_env(i, None if scenarios is None else scenarios[i], level)
                for i in range(self.num_envs)
            ]
        )

    # ------------------------------------------------------------------ physics
    def _current_at(self, pos: np.ndarray) -> np.ndarray:
        """Current ``(E, R, 2)`` of each env's cores at the positions ``pos (E, R, 2)``."""
        present = self.core_present
        if self.max_cores == 0 or not present.any():
            return np.zeros_like(pos)
        rel = self.core_pos[:, None, :, :] - pos[:, :, None, :]  # (E, R, Q, 2), towards the core
        d = np.linalg.norm(rel, axis=-1)
        safe = np.where(d > 0.0, d, 1.0)
        n = rel / safe[..., None]
        cw = self.core_clockwise[:, None, :]
        tx = np.where(cw, -n[..., 1], n[..., 1])
        ty = np.where(cw, n[..., 0], -n[..., 0])
        gamma = self.core_gamma[:, None, :]
        speed = np.where(d <= C.CORE_R, gamma * d / (TWO_PI * C.CORE_R**2), gamma / (TWO_PI * safe))
        speed = np.where(present[:, None, :] & (d > 0.0), speed, 0.0)
        return np.stack([(speed * tx).sum(-1), (speed * ty).sum(-1)], axis=-1)

    def _accelerate(self, moving: np.ndarray) -> None:
        """One step of the 3-DOF manoeuvring model for the ``moving`` robots; updates ``vel_r``."""
        v = self.vessel
        c, s = np.cos(self.theta), np.sin(self.theta)
        ur = c * self.vel_r[..., 0] + s * self.vel_r[..., 1]
        vr = -s * self.vel_r[..., 0] + c * self.vel_r[..., 1]
        u = c * self.vel[..., 0] + s * self.vel[..., 1]
        vv = -s * self.vel[..., 0] + c * self.vel[..., 1]
        w = self.vel[..., 2]
        a13 = v.y_vdot * vr + v.y_rdot * w
        # b = -C_RB V - (C_A + D + D_n) V_r + tau, row by row.
        b0 = v.m * w * vv - (a13 * w - v.x_u * ur - v.x_uu * np.abs(ur) * ur)
        b1 = (
            -v.m * w * u
            - (-v.x_udot * ur * w)
            - (-v.y_v * vr - v.y_r * w)
            + (v.y_vv * np.abs(vr) + v.y_rv * np.abs(w)) * vr
            + (v.y_vr * np.abs(vr) + v.y_rr * np.abs(w)) * w
        )
        b2 = (
            -(-a13 * ur + v.x_udot * ur * vr)
            - (-v.n_v * vr - v.n_r * w)
            + (v.n_vv * np.abs(vr) + v.n_rv * np.abs(w)) * vr
            + (v.n_vr * np.abs(vr) + v.n_rr * np.abs(w)) * w
        )
        left, right = self.thrust[..., 0], self.thrust[..., 1]
        b0 = b0 + left + right
        b2 = b2 + (left - right) * (0.5 * v.width)
        b = np.stack([b0, b1, b2], axis=-1)
        acc = b @ self._acc.T
        ur = ur + acc[..., 0] * C.DT
        vr = vr + acc[..., 1] * C.DT
        w_new = w + acc[..., 2] * C.DT
        new = np.stack([c * ur - s * vr, s * ur + c * vr, w_new], axis=-1)
        self.vel_r = np.where(moving[..., None], new, self.vel_r)

    def _thrust_change(self, actions: np.ndarray) -> np.ndarray:
        """``(E, R, 2)`` thrust change per second from the actions."""
        if self.continuous:
            a = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, self.max_robots, 2)
            return np.clip(a, -1.0, 1.0) * C.CONTINUOUS_THRUST_CHANGE
        a = np.asarray(actions).reshape(self.num_envs, self.max_robots)
        if not np.issubdtype(a.dtype, np.integer):
            if not np.all(a == np.round(a)):
                raise ValueError("discrete marine-navigation actions must be integers in [0, 25)")
            a = a.astype(np.int64)
        if np.any((a < 0) | (a >= C.N_DISCRETE_ACTIONS)):
            raise ValueError(
                f"discrete marine-navigation actions must be in [0, 25), got {a.min()}..{a.max()}"
            )
        return C.DISCRETE_THRUST_CHANGES[a]

    # ------------------------------------------------------------------ step
    def step(self, actions: np.ndarray) -> StepResult:
        """Applies one action per robot slot (ignored for robots that are not active) for 0.5 s.

        Envs whose episode ended must be reset (``reset_env``) before they are stepped again; stepping one
        whose robots are all stopped changes nothing and returns zero rows.
        """
        moving = self.active.copy()
        change = self._thrust_change(actions)
        timeout = self.steps >= C.MAX_EPISODE_STEPS - 1  # (E,) the step taken after 1000 steps
        pos_before = self.pos.copy()
        dist_before = np.linalg.norm(self.goal - self.pos, axis=-1)
        for sub in range(C.SUBSTEPS):
            current = self._current_at(self.pos)
            vel = self.vel_r.copy()
            vel[..., :2] += current
            self.vel = np.where(moving[..., None], vel, self.vel)
            delta = self.vel * C.DT
            self.pos = np.where(moving[..., None], self.pos + delta[..., :2], self.pos)
            theta = np.where(moving, self.theta + delta[..., 2], self.theta)
            theta = np.where(theta < 0.0, theta + TWO_PI, theta)
            self.theta = np.where(theta >= TWO_PI, theta - TWO_PI, theta)
            if sub == 0:
                # (change * dt) * N, in the public env's order of operations (bit-equal thrusts).
                thrust = np.clip(self.thrust + change * C.DT * C.SUBSTEPS, C.MIN_THRUST, C.MAX_THRUST)
                self.thrust = np.where(moving[..., None], thrust, self.thrust)
            self._accelerate(moving)
        dist_after = np.linalg.norm(self.goal - self.pos, axis=-1)

        obs, collided, reached, colregs, phi = self._perceive(moving)
        self.collided |= collided
        self.reached |= reached
        self.colregs = colregs
        self.phi = np.where(colregs, phi, 0.0)

        timeout_r = moving & timeout[:, None]
        collision_r = moving & self.collided & ~timeout_r
        goal_r = moving & self.reached & ~timeout_r & ~collision_r
        reward = C.TIMESTEP_PENALTY + (dist_before - dist_after) + C.COLREGS_PENALTY * self.phi
        reward = reward + C.COLLISION_PENALTY * collision_r + C.GOAL_REWARD * goal_r
        reward = np.where(moving, reward, 0.0)
        self.outcome = np.where(timeout_r, C.TIMEOUT, self.outcome)
        self.outcome = np.where(collision_r, C.COLLISION, self.outcome)
        self.outcome = np.where(goal_r, C.GOAL, self.outcome).astype(np.int8)

        work = np.abs(self.thrust) * C.DT * C.SUBSTEPS
        self.energy += np.where(moving, work[..., 0] + work[..., 1], 0.0)
        self.travel_time += np.where(moving, C.ACTION_DURATION, 0.0)
        self.path_length += np.linalg.norm(self.pos - pos_before, axis=-1)
        # The public trainer's deactivation: collided or arrived robots leave the map after this step.
        self.active = moving & ~(self.collided | self.reached)
        self.steps += 1

        env_terminated = ~(self.active & self.present).any(axis=1)
        if self.end_on_collision:
            env_terminated |= (self.collided & self.present).any(axis=1)
        env_truncated = timeout & ~env_terminated
        return StepResult(
            obs=obs,
            reward=reward,
            terminated=collision_r | goal_r,
            truncated=timeout_r,
            outcome=self.outcome.copy(),
            env_terminated=env_terminated,
            env_truncated=env_truncated,
        )

    # ------------------------------------------------------------------ perception
    def _noise(
        self, shape: tuple[int, ...], envs: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position and velocity noise ``shape + (2,)``, radius factor ``shape``; each env's generator.

        Only the ``envs (E,)`` that observe draw (all by default); the others get no noise.
        """
        pos = np.zeros((*shape, 2))
        vel = np.zeros((*shape, 2))
        kappa = np.zeros(shape)
        if not self.perception_noise:
            return pos, vel, np.ones(shape)
        for i, rng in enumerate(self.rngs):
            if envs is not None and not envs[i]:
                continue
            pos[i] = rng.normal(0.0, C.POS_STD, size=(*shape[1:], 2))
            vel[i] = rng.normal(0.0, C.VEL_STD, size=(*shape[1:], 2))
            kappa[i] = rng.vonmises(0.0, C.R_KAPPA, size=shape[1:])
        factor = C.R_MEAN_RATIO + (1.0 - C.R_MEAN_RATIO) * kappa / math.pi
        return pos, vel, factor

    def _perceive(self, observers: np.ndarray) -> tuple[np.ndarray, ...]:
        """Observations, collision and goal flags and COLREGs terms of the ``observers (E, R)``.

        Returns ``obs (E, R, 37)`` float32 (zero rows for non-observers), ``collided``, ``reached``,
        ``colregs`` (bool) and ``phi`` (the COLREGs turn angle where ``colregs``), all ``(E, R)``.
        """
        E, R, K = self.num_envs, self.max_robots, self.max_obstacles
        M = K + R
        # Candidates per observer: the obstacles, then the other active robots (E, R, M, ...).
        cand_pos = np.concatenate(
            [
                np.broadcast_to(self.obstacle_pos[:, None], (E, R, K, 2)),
                np.broadcast_to(self.pos[:, None], (E, R, R, 2)),
            ],
            axis=2,
        )
        cand_vel = np.concatenate(
            [np.zeros((E, R, K, 2)), np.broadcast_to(self.vel[:, None, :, :2], (E, R, R, 2))], axis=2
        )
        cand_r = np.concatenate(
            [np.broadcast_to(self.obstacle_r[:, None], (E, R, K)), np.full((E, R, R), self.radius)], axis=2
        )
        others = self.active[:, None, :] & ~np.eye(R, dtype=bool)[None]
        valid = np.concatenate([np.broadcast_to(self.obstacle_present[:, None], (E, R, K)), others], axis=2)
        valid &= observers[..., None]

        pos_noise, vel_noise, r_factor = self._noise((E, R, M), observers.any(axis=1))
        seen_pos = cand_pos + pos_noise
        seen_vel = cand_vel + vel_noise
        seen_r = cand_r * r_factor
        c = np.cos(self.theta)[..., None]
        s = np.sin(self.theta)[..., None]
        dx = seen_pos[..., 0] - self.pos[:, :, None, 0]
        dy = seen_pos[..., 1] - self.pos[:, :, None, 1]
        px, py = c * dx + s * dy, -s * dx + c * dy
        vx = c * seen_vel[..., 0] + s * seen_vel[..., 1]
        vy = -s * seen_vel[..., 0] + c * seen_vel[..., 1]
        dist = np.sqrt(px**2 + py**2)
        detected = valid & (dist <= C.PERCEPTION_RANGE + seen_r)

        true_gap = np.linalg.norm(cand_pos - self.pos[:, :, None], axis=-1) - cand_r - self.radius
        collided = (detected & (true_gap <= 0.0)).any(axis=-1)
        reached = observers & (np.linalg.norm(self.goal - self.pos, axis=-1) <= C.GOAL_DIS)

        key = np.where(detected, dist - seen_r - self.radius, np.inf)
        order = np.argsort(key, axis=-1, kind="stable")[..., : C.MAX_OBJECTS]
        n_seen = np.minimum(detected.sum(-1), C.MAX_OBJECTS)
        mask = np.arange(C.MAX_OBJECTS) < n_seen[..., None]  # (E, R, 5)
        if M < C.MAX_OBJECTS:
            order = np.concatenate([order, np.zeros((E, R, C.MAX_OBJECTS - M), dtype=order.dtype)], axis=-1)
        objects = np.stack([np.take_along_axis(a, order, axis=-1) for a in (px, py, vx, vy, seen_r)], axis=-1)
        objects = np.where(mask[..., None], objects, 0.0)

        vc, vs = np.cos(self.theta), np.sin(self.theta)
        ego_vx = vc * self.vel[..., 0] + vs * self.vel[..., 1]
        ego_vy = -vs * self.vel[..., 0] + vc * self.vel[..., 1]
        goal_dx, goal_dy = self.goal[..., 0] - self.pos[..., 0], self.goal[..., 1] - self.pos[..., 1]
        own = np.stack(
            [
                vc * goal_dx + vs * goal_dy,
                -vs * goal_dx + vc * goal_dy,
                ego_vx,
                ego_vy,
                self.vel[..., 2],
                self.thrust[..., 0],
                self.thrust[..., 1],
            ],
            axis=-1,
        )
        colregs, phi = self._colregs(objects, mask, ego_vx, ego_vy)
        colregs &= observers
        obs = np.concatenate([own, objects.reshape(E, R, -1), mask.astype(np.float64)], axis=-1)
        obs = np.where(observers[..., None], obs, 0.0).astype(np.float32)
        return obs, collided & observers, reached, colregs, phi

    def _colregs(
        self, objects: np.ndarray, mask: np.ndarray, ego_vx: np.ndarray, ego_vy: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Head-on and left-crossing checks against the kept objects (``docs/marinenav.md`` section 5).

        Returns the flag ``(E, R)`` (some object needs a turn to starboard) and the first such object's ``φ``.
        """
        px, py, ovx, ovy, orad = (objects[..., k] for k in range(5))
        ego_vx, ego_vy = ego_vx[..., None], ego_vy[..., None]
        moving = (np.hypot(ovx, ovy) >= C.COLREGS_MIN_SPEED) & (
            np.hypot(ego_vx, ego_vy) >= C.COLREGS_MIN_SPEED
        )
        alpha = np.arctan2(ovy, ovx)
        ca, sa = np.cos(alpha), np.sin(alpha)
        # Ego position and velocity in the other vessel's frame (origin at it, x along its velocity).
        ex, ey = -(ca * px + sa * py), -(-sa * px + ca * py)
        evx, evy = ca * ego_vx + sa * ego_vy, -sa * ego_vx + ca * ego_vy
        heading = np.arctan2(evy, evx)
        (x_lo, x_hi), (y_lo, y_front) = C.LEFT_CROSSING_X, C.LEFT_CROSSING_Y
        triangle = (ey - y_front) > (y_front / x_hi) * (ex - x_hi)
        left = (
            (ex >= x_lo)
            & (ex <= x_hi)
            & (ey >= y_lo)
            & (ey <= 0.0)
            & ~triangle
            & (heading >= math.pi / 4)
            & (heading <= 3 * math.pi / 4)
        )
        head_on = (
            (ex >= 0.0)
            & (ex <= C.HEAD_ON_X)
            & (np.abs(ey) <= 0.5 * C.HEAD_ON_Y)
            & (np.abs(heading) > 3 * math.pi / 4)
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            base = orad + C.COLREGS_MARGIN
            dist = np.hypot(px, py)
            add1 = np.arcsin(base / dist)
            add2 = np.arctan2(self.radius, np.sqrt(dist**2 - base**2))
            desired = wrap_to_pi(np.arctan2(py, px) + add1 + add2)
            phi = wrap_to_pi(desired - np.arctan2(ego_vy, ego_vx))
            applies = mask & moving & (left | head_on) & (phi > 0.0)
        first = np.argmax(applies, axis=-1)
        flag = applies.any(axis=-1)
        chosen = np.take_along_axis(phi, first[..., None], axis=-1)[..., 0]
        return flag, np.where(flag, chosen, 0.0)

    def info(self) -> dict[str, Any]:
        """Per-robot bookkeeping ``(E, R)`` for logging and evaluation."""
        return {
            "present": self.present.copy(),
            "active": self.active.copy(),
            "outcome": self.outcome.copy(),
            "reached": self.reached & self.present,
            "collided": self.collided & self.present,
            "energy": self.energy.copy(),
            "travel_time": self.travel_time.copy(),
            "path_length": self.path_length.copy(),
        }
