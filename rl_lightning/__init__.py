"""rl_lightning: reinforcement learning on PyTorch Lightning, TorchRL data, Hydra config and MLflow runs."""

__version__ = "0.1.0"
