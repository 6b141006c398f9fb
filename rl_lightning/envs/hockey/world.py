"""Box2D world of the hockey rink: bodies, contact rules and the per-step control laws.

One :class:`HockeyWorld` owns a ``b2World`` with the static rink (walls and goals) and the three dynamic
bodies (two rackets and the puck). The bodies live as long as the world: an unseeded reset moves them back
(a seeded one builds a fresh world, see :meth:`HockeyWorld.build`), and the control laws read and write
Box2D state through plain Python floats, so a step allocates nothing beyond the few wrapper objects pybox2d
creates per attribute access.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import Box2D
from Box2D.b2 import circleShape, contactListener, fixtureDef, polygonShape

from rl_lightning.envs.hockey import constants as C

# Fixture tags (``fixture.userData``): bit flags, so one OR of the two fixtures of a contact names the pair.
TAG_WALL = 0
TAG_PUCK = 1
TAG_PLAYER1 = 2
TAG_PLAYER2 = 4
TAG_GOAL1 = 8  # player 1's goal, on the left
TAG_GOAL2 = 16

_PUCK_IN_GOAL2 = TAG_PUCK | TAG_GOAL2
_PUCK_IN_GOAL1 = TAG_PUCK | TAG_GOAL1
_PUCK_PLAYER1 = TAG_PUCK | TAG_PLAYER1
_PUCK_PLAYER2 = TAG_PUCK | TAG_PLAYER2

# Catching needs the puck not to be moving away from the catcher faster than this (m/s).
_CATCH_VX = 0.1


def _px(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x / C.SCALE, y / C.SCALE) for x, y in points]


def racket_vertices(player_two: bool) -> list[tuple[float, float]]:
    """Racket polygon in its body frame (metres); player 2's is player 1's mirrored in x."""
    sx = -C.RACKET_FACTOR if player_two else C.RACKET_FACTOR
    return [(sx * x / C.SCALE, C.RACKET_FACTOR * y / C.SCALE) for x, y in C.RACKET_POLY_PX]


def wall_polygons() -> list[tuple[tuple[float, float], list[tuple[float, float]]]]:
    """The six walls as (body position, local polygon in metres), in the course environment's order.

    Top and bottom boxes, then the four side walls that run from the corners to the goal mouths; the side
    walls' mouth edge is bevelled by 7 px so the opening is wider on the rink side.
    """
    box = [(-250, 10), (-250, -10), (250, -10), (250, 10)]
    mouth = (C.H - 1) / 2 * C.SCALE - C.GOAL_SIZE
    side = [(-10, mouth), (10, mouth - 7), (10, -5), (-10, -5)]
    left_x = C.W / 2 - 245 / C.SCALE
    right_x = C.W / 2 + 245 / C.SCALE
    return [
        ((C.W / 2, C.H - 0.5), _px(box)),
        ((C.W / 2, 0.5), _px(box)),
        ((left_x, C.H - 0.5), _px([(x, -y) for x, y in side])),
        ((left_x, 0.5), _px(side)),
        ((right_x, C.H - 0.5), _px([(-x, -y) for x, y in side])),
        ((right_x, 0.5), _px([(-x, y) for x, y in side])),
    ]


@functools.cache
def _fixture_defs() -> dict[str, Any]:
    """Fixture definitions of every body, built once.

    Box2D copies a definition when it creates a fixture, so one set serves every world; pybox2d leaks a
    little memory for each definition object it frees, which a seeded reset (a new world) would otherwise
    pay every time.
    """
    walls = [
        fixtureDef(
            shape=polygonShape(vertices=poly),
            density=0,
            friction=C.WALL_FRICTION,
            categoryBits=C.CAT_WALL,
            maskBits=C.MASK_WALL,
            userData=TAG_WALL,
        )
        for _, poly in wall_polygons()
    ]
    goal = [(-C.GOAL_HALF_W, C.GOAL_HALF_H), (C.GOAL_HALF_W, C.GOAL_HALF_H)]
    goal += [(C.GOAL_HALF_W, -C.GOAL_HALF_H), (-C.GOAL_HALF_W, -C.GOAL_HALF_H)]

    def goal_part(mask: int, sensor: bool, tag: int) -> fixtureDef:
        return fixtureDef(
            shape=polygonShape(vertices=goal),
            density=0,
            friction=C.WALL_FRICTION,
            categoryBits=C.CAT_GOAL,
            maskBits=mask,
            isSensor=sensor,
            userData=tag,
        )

    def player(two: bool) -> fixtureDef:
        return fixtureDef(
            shape=polygonShape(vertices=racket_vertices(two)),
            density=C.PLAYER_DENSITY,
            friction=C.PLAYER_FRICTION,
            restitution=0.0,
            categoryBits=C.CAT_PLAYER,
            maskBits=C.MASK_PLAYER,
            userData=TAG_PLAYER2 if two else TAG_PLAYER1,
        )

    return {
        "walls": walls,
        # A goal's sensor sees only the puck (scoring); its solid part stops only the players.
        "goal1": goal_part(C.MASK_GOAL_SENSOR, True, TAG_GOAL1),
        "goal2": goal_part(C.MASK_GOAL_SENSOR, True, TAG_GOAL2),
        "goal_solid": goal_part(C.MASK_GOAL_SOLID, False, TAG_WALL),
        "player1": player(False),
        "player2": player(True),
        "puck": fixtureDef(
            shape=circleShape(radius=C.PUCK_RADIUS, pos=(0, 0)),
            density=C.PUCK_DENSITY,
            friction=C.PUCK_FRICTION,
            restitution=C.PUCK_RESTITUTION,
            categoryBits=C.CAT_PUCK,
            maskBits=C.MASK_PUCK,
            userData=TAG_PUCK,
        ),
    }


class _ContactListener(contactListener):
    """Turns Box2D's begin-contact events into goals and catches.

    Box2D reports a contact in the step after the one in which the shapes started to overlap (new pairs are
    found at the end of a step and evaluated at the start of the next), exactly as in the course env.
    """

    def __init__(self, rink: HockeyWorld) -> None:
        super().__init__()
        self.rink = rink

    def BeginContact(self, contact: Box2D.b2Contact) -> None:
        pair = contact.fixtureA.userData | contact.fixtureB.userData
        rink = self.rink
        if pair == _PUCK_IN_GOAL2:
            rink.winner = 1
        elif pair == _PUCK_IN_GOAL1:
            rink.winner = -1
        elif rink.keep_mode:
            if pair == _PUCK_PLAYER1:
                if rink.puck.linearVelocity.x < _CATCH_VX and rink.hold1 == 0:
                    rink.hold1 = C.MAX_TIME_KEEP_PUCK
            elif pair == _PUCK_PLAYER2 and rink.puck.linearVelocity.x > -_CATCH_VX and rink.hold2 == 0:
                rink.hold2 = C.MAX_TIME_KEEP_PUCK

    def EndContact(self, contact: Box2D.b2Contact) -> None:
        pass


class HockeyWorld:
    """The rink's physics.

    Attributes:
        world: the ``b2World``.
        player1, player2, puck: the dynamic bodies.
        hold1, hold2: puck-hold counters (0 = not holding, else steps left, counting down from 15).
        winner: +1 once the puck reached the right goal, -1 the left one, 0 otherwise.
    """

    def __init__(self, keep_mode: bool = True) -> None:
        self.keep_mode = keep_mode
        self.hold1 = 0
        self.hold2 = 0
        self.winner = 0
        self.build()

    def build(self) -> None:
        """Creates a fresh ``b2World`` with all bodies at their start positions.

        A fresh world has no history in its broad-phase tree or contact lists, so a seeded episode does not
        depend on what ran before it (Box2D's solver order follows those structures).
        """
        defs = _fixture_defs()
        world = Box2D.b2World(gravity=(0, 0))
        for (position, _), wall in zip(wall_polygons(), defs["walls"]):
            world.CreateStaticBody(position=position, fixtures=wall)
        for x, sensor in ((C.GOAL_LEFT_X, defs["goal1"]), (C.GOAL_RIGHT_X, defs["goal2"])):
            world.CreateStaticBody(position=(x, C.CENTER_Y), fixtures=[sensor, defs["goal_solid"]])
        self.player1 = world.CreateDynamicBody(position=C.PLAYER1_START, fixtures=defs["player1"])
        self.player2 = world.CreateDynamicBody(position=C.PLAYER2_START, fixtures=defs["player2"])
        self.puck = world.CreateDynamicBody(position=(C.CENTER_X, C.CENTER_Y), fixtures=defs["puck"])
        self.puck.linearDamping = C.PUCK_DAMPING
        # pybox2d keeps only a borrowed pointer to the listener: hold the Python object here.
        self._listener = _ContactListener(self)
        world.contactListener = self._listener
        self.world = world
        # Mass is fixed by the fixtures; caching it spares a SWIG call per use.
        self.player_mass = self.player1.mass
        self.puck_mass = self.puck.mass
        self._player_m_dt = self.player_mass / C.DT
        self._shot_force = C.SHOOT_SPEED * self.puck_mass / C.DT
        self._step = world.Step

    def settle(self) -> None:
        """Lets a freshly built world find the contacts of its bodies as built, without a time step.

        Box2D looks for the contacts of new bodies at the start of the next step, and for those of bodies
        moved afterwards only at its end. A settled fresh world steps its next episode as a world that has
        run before does: the bodies :meth:`place` moves meet what they touch at the end of the first step.
        """
        self._step(0.0, C.VELOCITY_ITERATIONS, C.POSITION_ITERATIONS)

    def place(
        self,
        player1: tuple[float, float],
        player2: tuple[float, float],
        puck: tuple[float, float],
    ) -> None:
        """Puts the bodies at rest at the given world positions (angle 0) and clears scores and holds."""
        for body, position in ((self.player1, player1), (self.player2, player2), (self.puck, puck)):
            self._teleport(body, position, 0.0)
        self.puck.linearDamping = C.PUCK_DAMPING
        self.hold1 = 0
        self.hold2 = 0
        self.winner = 0

    def set_state(self, s: Sequence[float]) -> None:
        """Teleports the bodies to an 18-value state in the observation layout (puck angle and spin 0).

        The hold counters are taken from entries 16-17 and the winner is cleared.
        """
        cx, cy = C.CENTER_X, C.CENTER_Y
        for body, i in ((self.player1, 0), (self.player2, 6)):
            self._teleport(body, (s[i] + cx, s[i + 1] + cy), s[i + 2])
            body.linearVelocity = (s[i + 3], s[i + 4])
            body.angularVelocity = s[i + 5]
        self._teleport(self.puck, (s[12] + cx, s[13] + cy), 0.0)
        self.puck.linearVelocity = (s[14], s[15])
        self.hold1 = int(s[16]) if self.keep_mode else 0
        self.hold2 = int(s[17]) if self.keep_mode else 0
        self.winner = 0

    def body_states(self) -> dict[str, Any]:
        """Every dynamic body's exact state (position, angle, velocities, damping; Box2D's own float32
        values as Python floats), the hold counters and the winner: what :meth:`set_body_states` restores."""
        bodies = {}
        for name in ("player1", "player2", "puck"):
            body = getattr(self, name)
            p, v = body.position, body.linearVelocity
            bodies[name] = [p.x, p.y, body.angle, v.x, v.y, body.angularVelocity, body.linearDamping]
        return {"bodies": bodies, "hold1": self.hold1, "hold2": self.hold2, "winner": self.winner}

    def set_body_states(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`body_states` returned (without the contacts the bodies had: the next step
        finds them again)."""
        for name, (x, y, angle, vx, vy, w, damping) in state["bodies"].items():
            body = getattr(self, name)
            self._teleport(body, (x, y), angle)
            body.linearVelocity = (vx, vy)
            body.angularVelocity = w
            body.linearDamping = damping
        self.hold1, self.hold2, self.winner = int(state["hold1"]), int(state["hold2"]), int(state["winner"])

    @staticmethod
    def _teleport(body: Box2D.b2Body, position: tuple[float, float], angle: float) -> None:
        # Deactivating drops the body's contacts, so the new state starts without stale contact impulses or
        # begin-contact events swallowed by a contact that outlived the jump.
        body.active = False
        body.transform = (position, angle)
        body.active = True
        # Falling asleep and waking again zeroes velocities, forces and the sleep timer, like a new body.
        body.awake = False
        body.awake = True

    def kick_puck(self, dx: float, dy: float) -> None:
        """Queues a shot of the resting puck along the unit vector (dx, dy), applied by the next step."""
        f = self._shot_force
        self.puck.ApplyForceToCenter((dx * f, dy * f), True)

    def step(self, a: Sequence[float]) -> None:
        """Applies the 8 action values ``[p1 fx, fy, torque, shoot, p2 ...]`` and advances one tick."""
        self._translate(self.player1, a[0], a[1], True)
        self._rotate(self.player1, a[2])
        self._translate(self.player2, a[4], a[5], False)
        self._rotate(self.player2, a[6])
        puck = self.puck
        v = puck.linearVelocity
        vx = v.x
        vy = v.y
        # Heavy damping above the speed limit: a 60 m/s shot loses 20% per step until it is under 25 m/s.
        if math.sqrt(vx * vx + vy * vy) > C.MAX_PUCK_SPEED:
            puck.linearDamping = C.PUCK_DAMPING_FAST
        else:
            puck.linearDamping = C.PUCK_DAMPING
        if self.keep_mode:
            if self.hold1 > 1:
                self.hold1 = self._hold(self.player1, self.hold1, a[3], 1.0)
            if self.hold2 > 1:
                self.hold2 = self._hold(self.player2, self.hold2, a[7], -1.0)
        self._step(C.DT, C.VELOCITY_ITERATIONS, C.POSITION_ITERATIONS)

    def _hold(self, player: Box2D.b2Body, counter: int, shoot: float, direction: float) -> int:
        # The puck rides on the racket's origin; Box2D's overlap resolution then pushes it out in front.
        puck = self.puck
        puck.position = player.position
        puck.linearVelocity = player.linearVelocity
        counter -= 1
        if counter == 1 or shoot > C.SHOOT_THRESHOLD:
            angle = player.angle
            f = direction * self._shot_force
            puck.ApplyForceToCenter((math.cos(angle) * f, math.sin(angle) * f), True)
            counter = 0
        return counter

    def _translate(self, body: Box2D.b2Body, ax: float, ay: float, one: bool) -> None:
        # Player 2's force is negated so that +x means "toward the opponent" in each player's frame.
        if ax > 1.0:
            ax = 1.0
        elif ax < -1.0:
            ax = -1.0
        if ay > 1.0:
            ay = 1.0
        elif ay < -1.0:
            ay = -1.0
        sign = 1.0 if one else -1.0
        fx = sign * ax * C.FORCE_MULTIPLIER
        fy = sign * ay * C.FORCE_MULTIPLIER
        pos = body.position
        x = pos.x
        y = pos.y
        vel = body.linearVelocity
        vx = vel.x
        vy = vel.y
        if (x > C.CENTER_X - C.ZONE) if one else (x < C.CENTER_X + C.ZONE):
            # Near the centre line the x-force is replaced by a spring-like brake that bounces the player
            # back before it crosses (about 0.32 m short of the line).
            m_dt = self._player_m_dt
            fx = -2.0 * vx * m_dt if (vx > 0.0 if one else vx < 0.0) else 0.0
            fx += -sign * (x - C.CENTER_X) * vx * m_dt
            body.linearDamping = C.PLAYER_DAMPING_BRAKE
        else:
            speed = math.sqrt(vx * vx + vy * vy)
            if speed < C.MAX_PLAYER_SPEED:
                body.linearDamping = C.PLAYER_DAMPING
            else:
                body.linearDamping = C.PLAYER_DAMPING_BRAKE
                # Above the speed limit a force is applied only if it slows the player down.
                k = C.DT / self.player_mass
                nvx = vx + k * fx
                nvy = vy + k * fy
                if not math.sqrt(nvx * nvx + nvy * nvy) < speed:
                    return
        # Rink limits: a player pushing outward past them stops in that axis and gets no force in it.
        if fx < 0.0:
            stop_x = x < C.PLAYER_X_MIN if one else x < C.CENTER_X
        elif fx > 0.0:
            stop_x = x > C.CENTER_X if one else x > C.PLAYER_X_MAX
        else:
            stop_x = False
        stop_y = (y > C.PLAYER_Y_MAX and fy > 0.0) or (y < C.PLAYER_Y_MIN and fy < 0.0)
        if stop_x or stop_y:
            if stop_x:
                vx = fx = 0.0
            if stop_y:
                vy = fy = 0.0
            body.linearVelocity = (vx, vy)
        body.ApplyForceToCenter((fx, fy), True)

    def _rotate(self, body: Box2D.b2Body, a: float) -> None:
        angle = body.angle
        if angle > C.MAX_ANGLE or angle < -C.MAX_ANGLE:
            # Past the limit the torque pulls back, scaled by the mass (not the inertia) as in the course env.
            w = body.angularVelocity
            m_dt = self._player_m_dt
            torque = -0.1 * w * m_dt if angle * w > 0.0 else 0.0
            torque += -0.1 * angle * m_dt
            body.angularDamping = C.PLAYER_ANGULAR_DAMPING_LIMIT
        else:
            if a > 1.0:
                a = 1.0
            elif a < -1.0:
                a = -1.0
            torque = a * C.TORQUE_MULTIPLIER
            body.angularDamping = C.PLAYER_ANGULAR_DAMPING
        body.ApplyTorque(torque, True)

    def state(self) -> list[float]:
        """The 18 observation values of player 1 as Python floats (positions relative to the centre)."""
        p1 = self.player1
        p2 = self.player2
        puck = self.puck
        a = p1.position
        b = p1.linearVelocity
        c = p2.position
        d = p2.linearVelocity
        e = puck.position
        f = puck.linearVelocity
        cx = C.CENTER_X
        cy = C.CENTER_Y
        return [
            a.x - cx,
            a.y - cy,
            p1.angle,
            b.x,
            b.y,
            p1.angularVelocity,
            c.x - cx,
            c.y - cy,
            p2.angle,
            d.x,
            d.y,
            p2.angularVelocity,
            e.x - cx,
            e.y - cy,
            f.x,
            f.y,
            float(self.hold1),
            float(self.hold2),
        ]
