"""Videos of the deterministic policy: a few evaluation episodes rendered to a GIF or MP4 file.

Every environment renders through gymnasium's ``render_mode="rgb_array"`` (the laser-hockey env draws its
own frames with numpy; gymnasium's classic-control envs draw with pygame). Files are written with imageio:
GIF needs nothing more, MP4 needs ``imageio-ffmpeg`` (``pip install 'rl_lightning[video]'``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning as L
import numpy as np
import torch
from tensordict import TensorDict

from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig, agent_group_of, make_gym_env

__all__ = ["VIDEO_FORMATS", "VideoError", "check_video_format", "record_video"]

VIDEO_FORMATS = ("gif", "mp4")


class VideoError(ValueError):
    """A video cannot be written here (a missing optional package, an unknown format)."""


def check_video_format(fmt: str) -> None:
    """Raises :class:`VideoError` (one line: what to install) when ``fmt`` cannot be written here."""
    if fmt not in VIDEO_FORMATS:
        raise VideoError(f"video format {fmt!r}: choose one of {', '.join(VIDEO_FORMATS)}.")
    try:
        import imageio.v3  # noqa: F401
    except ImportError:
        raise VideoError("videos need imageio: pip install 'rl_lightning[video]'.") from None
    if fmt == "mp4":
        try:
            import imageio_ffmpeg  # noqa: F401
        except ImportError:
            raise VideoError(
                "mp4 videos need imageio-ffmpeg: pip install 'rl_lightning[video]' (or use gif)."
            ) from None


@torch.no_grad()
def record_video(
    module: L.LightningModule,
    env_cfg: EnvConfig,
    path: str | Path,
    episodes: int = 1,
    seed: int = 0,
    fps: int = 30,
    max_frames: int = 5_000,
    copies: DeviceCopies | None = None,
) -> Path:
    """Plays ``episodes`` episodes with ``module.act_eval`` on one rendering env and writes them to ``path``.

    Args:
        module: an algorithm module (its train/eval mode is restored after).
        env_cfg: the env (its kwargs, with ``render_mode="rgb_array"`` added).
        path: the file to write; its suffix (``.gif`` or ``.mp4``) picks the format.
        episodes: episodes in the video, one after the other.
        seed: seeds the env and the policy's own randomness (the same seed gives the same video).
        fps: frames per second of the video.
        max_frames: stop after this many frames (a policy that never ends an episode).
        copies: the run's device copies (routes ``eval_observations`` and ``eval_actions``); ``None``:
            plain copies of its own.

    Returns:
        The path written.

    Raises:
        VideoError: unknown format or a missing optional package (one line that says what to install).
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    check_video_format(fmt)
    if episodes < 1:
        raise VideoError("video episodes must be >= 1.")
    import imageio.v3 as iio

    env = make_gym_env(dataclasses.replace(env_cfg, kwargs={**env_cfg.kwargs, "render_mode": "rgb_array"}))
    # With an agent group (marine navigation's robots) an observation holds one row per agent: a batch.
    agents = agent_group_of(env_cfg) is not None
    was_training = module.training
    module.eval()
    frames: list[np.ndarray] = []
    devices = [module.device] if module.device.type == "cuda" else []
    copies = copies or DeviceCopies(module.device, module.device)
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            for episode in range(episodes):
                obs, _ = env.reset(seed=seed + episode)
                frames.append(env.render())
                step, done = 0, False
                while not done and len(frames) < max_frames:
                    rows = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
                    rows = rows if agents else rows[None]
                    td = TensorDict(
                        {
                            "observation": rows,
                            "step_count": torch.full((rows.shape[0], 1), step),
                        },
                        batch_size=[rows.shape[0]],
                        device="cpu",
                    )
                    action = module.act_eval(copies.to_policy(td, "eval_observations")).get("action")
                    action = copies.to_env(action, "eval_actions").numpy()
                    action = action if agents else action[0]
                    obs, _, terminated, truncated, _ = env.step(action)
                    frames.append(env.render())
                    step, done = step + 1, terminated or truncated
    finally:
        env.close()
        module.train(was_training)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "gif":
        iio.imwrite(path, np.stack(frames), duration=1000 / fps, loop=0)
    else:
        iio.imwrite(path, np.stack(frames), plugin="FFMPEG", fps=fps, macro_block_size=1)
    return path
