"""Image-observation games: Atari through ale-py and MinAtar, with the preprocessing each protocol fixes.

Both are optional (``pip install 'rl_lightning[atari]'``): their gymnasium ids are registered when the
package is importable, and an id of either names the extra in one line when it is not.

**Atari** (``env.preprocess=atari``), the protocol of Machado et al. (2018, "Revisiting the Arcade Learning
Environment"): sticky actions with probability 0.25 (ALE v5's ``repeat_action_probability``, set in
``conf/env/atari.yaml``) instead of no-op starts; :class:`AtariFrames` repeats each action for 4 frames and
max-pools the last two (Atari sprites flicker), converts to 84x84 grayscale and keeps uint8; an episode ends
at game over, not at a lost life; the ALE's limit of 108,000 frames (27,000 agent steps) truncates it.
Rewards are clipped to their sign for training only (``env.reward_clip``, applied by
:class:`~rl_lightning.envs.vector.GymVecEnv`): evaluation and the logged episode returns are the game's own
score. The last ``env.frame_stack`` (4) frames are stacked.

**MinAtar** (``env.preprocess=minatar``, Young and Tian 2019): 10x10 grids with one boolean channel per
object kind, sticky actions 0.1 and difficulty ramping as the package sets them, no frame skip and no frame
stack (the channels carry the motion). Observations become channels-first uint8 ``[C, 10, 10]`` and
``render`` draws the grid in colour without the package's seaborn dependency.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import gymnasium as gym
import numpy as np
import torch

__all__ = [
    "ATARI_EXTRA",
    "PREPROCESSING",
    "AtariFrames",
    "MinAtarObservation",
    "MissingExtraError",
    "area_taps",
    "area_weights",
    "check_image_env_available",
    "preprocess",
    "register_image_envs",
]

ATARI_EXTRA = "pip install 'rl_lightning[atari]'"
#: Gymnasium id prefixes of the image games and the package each needs.
_PACKAGES = {"ALE/": ("ale_py", "ale-py"), "MinAtar/": ("minatar", "minatar")}
#: What ``env.preprocess`` accepts (``None``: the env as gymnasium makes it).
PREPROCESSING = ("atari", "minatar")


class MissingExtraError(ValueError):
    """An env id whose package (an optional extra) is not installed."""


def _package_for(env_id: str) -> tuple[str, str] | None:
    return next((pkg for prefix, pkg in _PACKAGES.items() if env_id.startswith(prefix)), None)


def check_image_env_available(env_id: str) -> None:
    """Raises :class:`MissingExtraError` for an Atari or MinAtar id whose package is missing."""
    package = _package_for(env_id)
    if package is not None and importlib.util.find_spec(package[0]) is None:
        raise MissingExtraError(f"{env_id} needs {package[1]}, which is not installed: {ATARI_EXTRA}.")


def register_image_envs(env_id: str) -> None:
    """Registers the ids of the package ``env_id`` belongs to (ALE's or MinAtar's), if installed."""
    package = _package_for(env_id)
    if package is None or importlib.util.find_spec(package[0]) is None or env_id in gym.registry:
        return
    if package[0] == "ale_py":
        import ale_py

        gym.register_envs(ale_py)
    else:
        # minatar.gym warns through the root logger that seaborn (for its own pixel render) is missing: our
        # wrapper renders without it.
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)
        try:
            from minatar.gym import register_envs
        finally:
            root.setLevel(level)
        register_envs()


def area_weights(n_in: int, n_out: int) -> np.ndarray:
    """``[n_out, n_in]`` weights of an area resize along one axis: output ``i`` averages the input over
    ``[i, i + 1) * n_in / n_out``, each input pixel weighted by its overlap (OpenCV's ``INTER_AREA`` when
    shrinking)."""
    scale = n_in / n_out
    lo = np.arange(n_out)[:, None] * scale
    pixels = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(pixels + 1, lo + scale) - np.maximum(pixels, lo), 0, None)
    return (overlap / scale).astype(np.float32)


def area_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`area_weights` as taps: the input indices ``[n_out, K]`` each output reads and their weights
    (``K`` is at most ``ceil(n_in / n_out) + 1``; unused taps read the last pixel with weight 0)."""
    weights = area_weights(n_in, n_out)
    k = int((weights > 0).sum(1).max())
    index = np.zeros((n_out, k), np.int64)
    taps = np.zeros((n_out, k), np.float32)
    for i, row in enumerate(weights):
        used = np.flatnonzero(row)
        index[i] = np.concatenate([used, np.full(k - len(used), used[-1])])
        taps[i, : len(used)] = row[used]
    return index, taps


class AtariFrames(gym.Wrapper):
    """The frames of the Atari protocol: gymnasium's ``AtariPreprocessing`` with ``noop_max=0``,
    ``frame_skip=4``, 84x84 grayscale, episodes to game over, and its resize done here.

    Each step repeats the action for ``frame_skip`` emulator frames (the ALE's own ``frameskip`` must be 1),
    sums their rewards, and returns the maximum of the last two grayscale screens, shrunk to ``size`` by an
    area average. ``AtariPreprocessing`` does the same with OpenCV's ``cv2.resize``, a 60 MB dependency for
    one resize; the separable weights here are ``INTER_AREA``'s (:func:`area_weights`), applied as a few
    taps per output pixel in numpy (about 0.1 ms a frame, as OpenCV; a matrix product would go through a
    multi-threaded BLAS, ten times slower on busy cores), so the frames agree with OpenCV's to rounding
    (``tests/envs/test_image_envs.py`` compares the two where OpenCV is installed).

    Args:
        env: an ALE env with ``frameskip=1``.
        frame_skip: emulator frames per step.
        size: the side of the square output frame.
    """

    def __init__(self, env: gym.Env, frame_skip: int = 4, size: int = 84) -> None:
        from rl_lightning.compat import atari_frameskip

        super().__init__(env)
        if atari_frameskip(env.unwrapped) not in (1, None):
            raise ValueError("AtariFrames repeats actions itself: make the ALE env with frameskip=1.")
        self.frame_skip = frame_skip
        self.ale = env.unwrapped.ale
        h, w = env.observation_space.shape[:2]
        self.screens = np.zeros((2, h, w), np.uint8)
        self.rows, self.cols = area_taps(h, size), area_taps(w, size)
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        total, terminated, truncated, info = 0.0, False, False, {}
        for t in range(self.frame_skip):
            _, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            if terminated or truncated:
                break
            if t >= self.frame_skip - 2:  # the last two screens: [0] the last, [1] the one before
                self.ale.getScreenGrayscale(self.screens[self.frame_skip - 1 - t])
        return self._frame(), total, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        _, info = self.env.reset(**kwargs)
        self.ale.getScreenGrayscale(self.screens[0])
        self.screens[1].fill(0)
        return self._frame(), info

    def get_env_state(self) -> dict[str, Any]:
        """The last two screens (a step that ends the episode early pools with them): what a checkpoint keeps
        of this wrapper (:mod:`rl_lightning.envs.state`)."""
        return {"screens": torch.from_numpy(self.screens.copy())}

    def set_env_state(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned."""
        self.screens[:] = state["screens"].numpy()

    def _frame(self) -> np.ndarray:
        np.maximum(self.screens[0], self.screens[1], out=self.screens[0])
        (rows, row_taps), (cols, col_taps) = self.rows, self.cols
        shrunk = (self.screens[0].astype(np.float32)[rows] * row_taps[:, :, None]).sum(1)  # [size, w]
        shrunk = (shrunk[:, cols] * col_taps).sum(2)  # [size, size]
        return np.rint(shrunk).astype(np.uint8)


class MinAtarObservation(gym.ObservationWrapper):
    """MinAtar's ``[10, 10, C]`` boolean grid as a channels-first uint8 ``[C, 10, 10]`` observation of 0/1,
    and an ``rgb_array`` render of it (each channel its colour, 16 pixels a cell)."""

    #: Cell colours by channel (the first for empty cells); cycled for games with more channels.
    PALETTE = np.array(
        [[0, 0, 0], [230, 25, 75], [60, 180, 75], [255, 225, 25], [0, 130, 200], [245, 130, 48],
         [145, 30, 180], [70, 240, 240], [240, 50, 230], [210, 245, 60], [250, 190, 212]],
        dtype=np.uint8,
    )  # fmt: skip
    CELL = 16
    #: Keeps nothing between steps (:mod:`rl_lightning.envs.state` saves the env behind it).
    stateless = True

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        h, w, c = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, (c, h, w), np.uint8)
        self._grid: np.ndarray | None = None

    def observation(self, observation: np.ndarray) -> np.ndarray:
        self._grid = np.asarray(observation)
        return np.ascontiguousarray(self._grid.transpose(2, 0, 1), dtype=np.uint8)

    def render(self) -> np.ndarray | None:
        if self._grid is None:
            return None
        c = self._grid.shape[-1]
        colour = 1 + (np.arange(c) % (len(self.PALETTE) - 1))
        # The highest channel present in a cell gives its colour, as MinAtar's own display does.
        cell = np.where(self._grid.any(-1), colour[np.argmax(self._grid * np.arange(1, c + 1), -1)], 0)
        return np.kron(self.PALETTE[cell], np.ones((self.CELL, self.CELL, 1), np.uint8))


def preprocess(kind: str | None, env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    """``gym.make(env_id, **kwargs)`` wrapped for the protocol ``kind`` (see the module docstring).

    Args:
        kind: ``atari``, ``minatar`` or ``None`` (the env as made).
        env_id: the gymnasium id.
        kwargs: keyword arguments for ``gym.make`` (``render_mode`` included).
    """
    if kind is None:
        return gym.make(env_id, disable_env_checker=True, **kwargs)
    if kind not in PREPROCESSING:
        raise ValueError(f"env.preprocess={kind!r}: use atari, minatar or null.")
    check_image_env_available(env_id)
    if kind == "atari":
        # AtariFrames repeats the action itself, so the ALE must not skip frames too.
        return AtariFrames(gym.make(env_id, disable_env_checker=True, **{**kwargs, "frameskip": 1}))
    return MinAtarObservation(gym.make(env_id, disable_env_checker=True, **kwargs))
