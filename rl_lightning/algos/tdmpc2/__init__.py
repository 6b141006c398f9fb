"""TD-MPC2 building blocks (Hansen, Su, Wang, ICLR 2024): world model, losses, latent MPPI planner."""

from rl_lightning.algos.tdmpc2.losses import (
    ModelLossOutput,
    TDMPC2Batch,
    TDMPC2Loss,
    batch_from_tensordict,
    model_param_groups,
)
from rl_lightning.algos.tdmpc2.math import RunningScale, discount_from_episode_length
from rl_lightning.algos.tdmpc2.module import TDMPC2
from rl_lightning.algos.tdmpc2.planner import LatentModel, MPPIPlanner
from rl_lightning.algos.tdmpc2.world_model import MODEL_SIZES, PolicyOutput, WorldModel, model_size_preset

__all__ = [
    "MODEL_SIZES",
    "TDMPC2",
    "LatentModel",
    "MPPIPlanner",
    "ModelLossOutput",
    "PolicyOutput",
    "RunningScale",
    "TDMPC2Batch",
    "TDMPC2Loss",
    "WorldModel",
    "batch_from_tensordict",
    "discount_from_episode_length",
    "model_param_groups",
    "model_size_preset",
]
