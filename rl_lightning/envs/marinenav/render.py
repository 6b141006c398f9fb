"""Pictures of a marine-navigation scenario: vessels, their goals and tracks, static obstacles and currents.

A small numpy rasteriser (no display library): the 55 x 55 m map at ``scale`` pixels per metre, y up. The
water is shaded by the current's speed (darker where it runs faster, arrows every 5 m where it runs at all)
with each vortex core ringed; obstacles are brown discs; each robot has its own colour for its disc (the
collision radius), its heading, its track and its goal ring (the goal radius). A robot that reached its goal
is drawn hollow, one that collided with a red cross.
"""

from __future__ import annotations

import itertools

import numpy as np

from rl_lightning.envs.marinenav import constants as C
from rl_lightning.envs.marinenav.core import MarineNavBatch

__all__ = ["draw_frame"]

WATER = np.array((196, 226, 242), dtype=np.float64)
DEEP = np.array((60, 110, 170), dtype=np.float64)
OBSTACLE = (120, 90, 60)
CORE = (30, 60, 110)
CROSS = (220, 30, 30)
PALETTE = (
    (230, 120, 30),
    (40, 150, 70),
    (150, 70, 170),
    (210, 60, 110),
    (30, 130, 170),
    (160, 140, 20),
    (90, 90, 90),
    (200, 90, 60),
)
#: Current speed drawn darkest (m/s): a core's rim speed.
CURRENT_FULL = 3.0


def _grid(size: int, scale: int) -> tuple[np.ndarray, np.ndarray]:
    """World coordinates ``(x, y)`` of the pixel centres, row 0 at the top (y up)."""
    centres = (np.arange(size) + 0.5) / scale
    x, y = np.meshgrid(centres, centres[::-1])
    return x, y


def _disc(img: np.ndarray, x: np.ndarray, y: np.ndarray, c: np.ndarray, r: float, color) -> None:
    img[(x - c[0]) ** 2 + (y - c[1]) ** 2 <= r * r] = color


def _ring(
    img: np.ndarray, x: np.ndarray, y: np.ndarray, c: np.ndarray, r: float, width: float, color
) -> None:
    d2 = (x - c[0]) ** 2 + (y - c[1]) ** 2
    img[(d2 <= r * r) & (d2 >= (r - width) ** 2)] = color


def _line(img: np.ndarray, a: np.ndarray, b: np.ndarray, scale: int, color, thick: int = 1) -> None:
    """A segment from ``a`` to ``b`` (world coordinates), ``thick`` pixels wide."""
    size = img.shape[0]
    n = int(np.ceil(np.linalg.norm(b - a) * scale * 2)) + 2
    t = np.linspace(0.0, 1.0, n)[:, None]
    pts = a + t * (b - a)
    cols = np.floor(pts[:, 0] * scale).astype(int)
    rows = size - 1 - np.floor(pts[:, 1] * scale).astype(int)
    for dr in range(-(thick // 2), thick - thick // 2):
        for dc in range(-(thick // 2), thick - thick // 2):
            r, c = rows + dr, cols + dc
            ok = (r >= 0) & (r < size) & (c >= 0) & (c < size)
            img[r[ok], c[ok]] = color


def draw_frame(
    sim: MarineNavBatch, env: int = 0, scale: int = 8, tracks: list[np.ndarray] | None = None
) -> np.ndarray:
    """The picture of env ``env`` of ``sim`` now: ``(55 * scale, 55 * scale, 3)`` uint8.

    Args:
        sim: the simulation.
        env: which of its envs.
        scale: pixels per metre.
        tracks: earlier positions of the robots, ``(R, 2)`` arrays oldest first, drawn as lines.
    """
    size = round(C.MAP_SIZE * scale)
    x, y = _grid(size, scale)
    # Currents: the speed on a 1 m grid, shading the water block by block.
    cells = int(C.MAP_SIZE)
    cx, cy = np.meshgrid(np.arange(cells) + 0.5, np.arange(cells) + 0.5)
    points = np.broadcast_to(np.stack([cx.ravel(), cy.ravel()], -1), (sim.num_envs, cells * cells, 2))
    current = sim._current_at(np.ascontiguousarray(points))[env].reshape(cells, cells, 2)
    speed = np.clip(np.linalg.norm(current, axis=-1) / CURRENT_FULL, 0.0, 1.0)
    cell = np.clip((y * 1.0).astype(int), 0, cells - 1), np.clip((x * 1.0).astype(int), 0, cells - 1)
    shade = speed[cell][..., None]
    img = (WATER * (1 - shade) + DEEP * shade).astype(np.uint8)
    for i in range(2, cells, 5):
        for j in range(2, cells, 5):
            v = current[i, j]
            if np.linalg.norm(v) > 0.05:
                a = np.array([j + 0.5, i + 0.5])
                tip = a + v / max(np.linalg.norm(v), 1e-9) * 2.0
                _line(img, a, tip, scale, CORE)
                _line(img, tip, tip, scale, CORE, thick=3)  # the arrow's head: the way the water runs
    for k in np.flatnonzero(sim.core_present[env]):
        _ring(img, x, y, sim.core_pos[env, k], C.CORE_R + 0.4, 0.3, CORE)
    for k in np.flatnonzero(sim.obstacle_present[env]):
        _disc(img, x, y, sim.obstacle_pos[env, k], sim.obstacle_r[env, k], OBSTACLE)
    radius = sim.radius
    for r in np.flatnonzero(sim.present[env]):
        color = PALETTE[r % len(PALETTE)]
        _ring(img, x, y, sim.goal[env, r], C.GOAL_DIS, 0.35, color)
        if tracks:
            path = np.stack([t[r] for t in tracks] + [sim.pos[env, r]])
            for a, b in itertools.pairwise(path):
                _line(img, a, b, scale, color)
        pos = sim.pos[env, r]
        if sim.active[env, r]:
            _disc(img, x, y, pos, radius, color)
        else:
            _ring(img, x, y, pos, radius, 0.4, color)
        heading = np.array([np.cos(sim.theta[env, r]), np.sin(sim.theta[env, r])])
        _line(img, pos, pos + heading * (radius + 1.5), scale, (0, 0, 0), thick=2)
        if sim.collided[env, r]:
            for d in (np.array([0.8, 0.8]) * radius, np.array([0.8, -0.8]) * radius):
                _line(img, pos - d, pos + d, scale, CROSS, thick=3)
    return img
