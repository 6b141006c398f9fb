"""Pictures of the rink.

``rgb_array`` frames come from a small rasteriser that follows pygame's integer drawing rules (truncated
vertex coordinates, scanline polygon fill, 2 px Bresenham outlines, midpoint circles), so frames match the
course environment's pygame frames without needing a display library; ``human`` shows the same frames in
a pygame window, imported only when first needed. Frames are (480, 600, 3) uint8 with y up.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np
from Box2D.b2 import polygonShape
from gymnasium.error import DependencyNotInstalled

from rl_lightning.envs.hockey import constants as C
from rl_lightning.envs.hockey.world import HockeyWorld, racket_vertices, wall_polygons

WHITE = (255, 255, 255)
GREY = (204, 204, 204)
ORANGE = (239, 203, 138)
BLACK = (0, 0, 0)
RED = (235, 98, 53)
BLUE = (93, 158, 199)

Color = tuple[int, int, int]
_SCALE32 = np.float32(C.SCALE)


def _hline(surf: np.ndarray, x1: int, y: int, x2: int, color: Color) -> None:
    h, w = surf.shape[:2]
    if not 0 <= y < h:
        return
    if x2 < x1:
        x1, x2 = x2, x1
    x1, x2 = max(x1, 0), min(x2, w - 1)
    if x1 <= x2:
        surf[y, x1 : x2 + 1] = color


def fill_circle(surf: np.ndarray, cx: float, cy: float, radius: float, color: Color) -> None:
    """pygame's filled midpoint circle (centre and radius truncated to integers) on an unflipped surface."""
    x0, y0, r = int(cx), int(cy), int(radius)
    f, ddf_x, ddf_y, x, y = 1 - r, 0, -2 * r, 0, r
    while x < y:
        if f >= 0:
            y -= 1
            ddf_y += 2
            f += ddf_y
        x += 1
        ddf_x += 2
        f += ddf_x + 1
        if f >= 0:
            _hline(surf, x0 - x, y0 + y - 1, x0 + x - 1, color)
            _hline(surf, x0 - x, y0 - y, x0 + x - 1, color)
        _hline(surf, x0 - y, y0 + x - 1, x0 + y - 1, color)
        _hline(surf, x0 - y, y0 - x, x0 + y - 1, color)


def _fill_polygon(surf: np.ndarray, xs: Sequence[int], ys: Sequence[int], color: Color) -> None:
    # Scanline fill: on each row, fill between sorted pairs of edge crossings (lower edge ends excluded).
    n = len(xs)
    miny, maxy = min(ys), max(ys)
    if miny == maxy:
        _hline(surf, min(xs), miny, max(xs), color)
        return
    for y in range(max(miny, 0), min(maxy, surf.shape[0] - 1) + 1):
        crossings = []
        for i in range(n):
            y1, y2, x1, x2 = ys[i - 1], ys[i], xs[i - 1], xs[i]
            if y1 == y2:
                continue
            if y1 > y2:
                y1, y2, x1, x2 = y2, y1, x2, x1
            if y1 <= y < y2 or (y == maxy and y2 == maxy):
                crossings.append((y - y1) * (x2 - x1) // (y2 - y1) + x1)
        crossings.sort()
        for i in range(0, len(crossings) - 1, 2):
            _hline(surf, crossings[i], y, crossings[i + 1], color)
    # Horizontal edges strictly inside the vertical range can be missed by the crossings above.
    for i in range(n):
        y = ys[i]
        if miny < y < maxy and ys[i - 1] == y:
            _hline(surf, xs[i], y, xs[i - 1], color)


def _thick_line(surf: np.ndarray, x1: int, y1: int, x2: int, y2: int, color: Color) -> None:
    # A 2 px Bresenham line: each point also colours its neighbour at +1 across the line's main direction.
    h, w = surf.shape[:2]
    across_x = abs(x1 - x2) <= abs(y1 - y2)
    dx, dy = abs(x2 - x1), abs(y2 - y1)
    sx = 1 if x1 < x2 else -1
    sy = 1 if y1 < y2 else -1
    err = int((dx if dx > dy else -dy) / 2)
    while True:
        if across_x:
            _hline(surf, x1, y1, x1 + 1, color)
        elif 0 <= x1 < w:
            surf[max(y1, 0) : min(y1 + 1, h - 1) + 1, x1] = color
        if x1 == x2 and y1 == y2:
            return
        e2 = err
        if e2 > -dx:
            err -= dy
            x1 += sx
        if e2 < dy:
            err += dx
            y1 += sy


def draw_polygon(surf: np.ndarray, pts: np.ndarray, color: Color) -> None:
    """A filled polygon with a 2 px outline in the same colour, as the course env draws every polygon.

    Args:
        surf: (H, W, 3) uint8 surface, row = y in pixels (unflipped).
        pts: (n, 2) integer pixel vertices in Box2D's vertex order.
        color: RGB.
    """
    xs, ys = pts[:, 0].tolist(), pts[:, 1].tolist()
    _fill_polygon(surf, xs, ys, color)
    # The outline path repeats the first vertex, so the closing segment is drawn too, then a zero-length one.
    path = [*zip(xs, ys), (xs[0], ys[0]), (xs[0], ys[0])]
    for (ax, ay), (bx, by) in itertools.pairwise(path):
        _thick_line(surf, ax, ay, bx, by, color)


def _radius_px(radius: float) -> float:
    # Box2D stores the radius in float32; the course env scales it in double precision (100 px -> 99.99...).
    return float(np.float32(radius)) * C.SCALE


def box2d_order(poly: Sequence[tuple[float, float]]) -> np.ndarray:
    """The polygon's vertices (float32, metres) in the order Box2D stores them (its convex hull)."""
    return np.asarray(polygonShape(vertices=list(poly)).vertices, dtype=np.float32)


def to_pixels(x: float, y: float, angle: float, local: np.ndarray) -> np.ndarray:
    """Integer pixel vertices of a body-frame polygon, computed in float32 as Box2D does, then truncated."""
    c = np.float32(math.cos(angle))
    s = np.float32(math.sin(angle))
    lx, ly = local[:, 0], local[:, 1]
    wx = (c * lx - s * ly) + np.float32(x)
    wy = (s * lx + c * ly) + np.float32(y)
    return np.stack([wx * _SCALE32, wy * _SCALE32], axis=1).astype(np.int64)


@functools.cache
def background() -> np.ndarray:
    """The static picture on an unflipped surface (row = y): white, centre circle, goal areas, walls.

    Read-only and built once; frames start from a copy.
    """
    surf = np.full((C.VIEWPORT_H, C.VIEWPORT_W, 3), 255, dtype=np.uint8)
    cx, cy = C.CENTER_X, C.CENTER_Y
    fill_circle(surf, cx * C.SCALE, cy * C.SCALE, _radius_px(100 / C.SCALE), GREY)
    # An orange disc at each end, then a white box over its rink-side part: a half-moon behind each mouth.
    # Box2D orders a polygon's vertices by its hull, so both boxes (same corner set) share one vertex list.
    side = 100 / C.SCALE
    box = box2d_order([(0, side), (side, side), (side, -side), (0, -side)])
    for disc_x, box_x in ((-250, -240), (250, 140)):
        px = float(np.float32(cx + disc_x / C.SCALE) * _SCALE32)
        fill_circle(surf, px, cy * C.SCALE, _radius_px(C.GOAL_SIZE / C.SCALE), ORANGE)
        draw_polygon(surf, to_pixels(cx + box_x / C.SCALE, cy, 0.0, box), WHITE)
    for (x, y), poly in wall_polygons():
        draw_polygon(surf, to_pixels(x, y, 0.0, box2d_order(poly)), BLACK)
    surf.flags.writeable = False
    return surf


_RACKETS = (box2d_order(racket_vertices(False)), box2d_order(racket_vertices(True)))


def draw_frame(world: HockeyWorld) -> np.ndarray:
    """A new (480, 600, 3) uint8 frame (y up) of the world's current state."""
    surf = background().copy()
    for body, local, color in ((world.player1, _RACKETS[0], RED), (world.player2, _RACKETS[1], BLUE)):
        pos = body.position
        draw_polygon(surf, to_pixels(pos.x, pos.y, body.angle, local), color)
    pos = world.puck.position
    fill_circle(
        surf,
        float(np.float32(pos.x) * _SCALE32),
        float(np.float32(pos.y) * _SCALE32),
        _radius_px(C.PUCK_RADIUS),
        BLACK,
    )
    return np.ascontiguousarray(surf[::-1])


class Window:
    """A pygame window that shows frames at the env's frame rate."""

    def __init__(self) -> None:
        try:
            import pygame
        except ImportError as err:
            raise DependencyNotInstalled(
                'render_mode="human" needs pygame: pip install pygame (or the "render" extra of rl_lightning)'
            ) from err
        self._pygame = pygame
        pygame.init()
        pygame.display.init()
        pygame.display.set_caption("Hockey")
        self._screen = pygame.display.set_mode((C.VIEWPORT_W, C.VIEWPORT_H))
        self._clock = pygame.time.Clock()

    def show(self, frame: np.ndarray) -> None:
        """Draws ``frame`` (image rows top to bottom) and waits for the next frame slot."""
        pygame = self._pygame
        pygame.surfarray.blit_array(self._screen, frame.swapaxes(0, 1))
        pygame.event.pump()
        self._clock.tick(C.FPS)
        pygame.display.flip()

    def close(self) -> None:
        """Closes the window."""
        self._pygame.display.quit()
        self._pygame.quit()
