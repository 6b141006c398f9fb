"""What a run needs around the algorithm: checkpoints, evaluation, update feedback, progress, metrics."""

from rl_lightning.training.checkpoint import FrameCheckpoint, replay_path
from rl_lightning.training.evaluation import EvalCallback, evaluate_policy, evaluate_variants
from rl_lightning.training.feedback import UpdateFeedback
from rl_lightning.training.metrics import log_metrics
from rl_lightning.training.progress import FramesProgressBar

__all__ = [
    "EvalCallback",
    "FrameCheckpoint",
    "FramesProgressBar",
    "UpdateFeedback",
    "evaluate_policy",
    "evaluate_variants",
    "log_metrics",
    "replay_path",
]
