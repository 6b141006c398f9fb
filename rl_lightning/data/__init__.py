"""The data path: collector, replay buffer and the experience stream."""

from rl_lightning.data.datamodule import CollectConfig, ExperienceStream, RLDataModule
from rl_lightning.data.replay import ReplayConfig, make_replay_buffer
from rl_lightning.device import resolve_device

__all__ = [
    "CollectConfig",
    "ExperienceStream",
    "RLDataModule",
    "ReplayConfig",
    "make_replay_buffer",
    "resolve_device",
]
