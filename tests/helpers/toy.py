"""A tiny LightningModule and DataModule implementing the hot-path protocol, for the callback tests.

The module is an actor and a critic trained by regression: ``act`` writes ``"action"`` into an observation
TensorDict (the data module calls it while "collecting", the way a TorchRL collector calls a policy), and
``update`` does one full gradient step on both networks with two optimizers plus a target-network ``lerp_``.
Everything is seeded, so two fits with the same seed give the same parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import ClassVar

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from tensordict import TensorDict
from torch import nn

OBS_DIM = 6
ACT_DIM = 2


class ToyProtocolModule(pl.LightningModule):
    """Actor-critic regression that implements ``hot_paths``/``optimizer_kwargs``/``cuda_graph_safe``."""

    hot_paths = ("update", "act")
    cuda_graph_safe = ("update", "act")

    def __init__(self, hidden: int = 32, lr: float = 1e-2, tau: float = 0.05) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.optimizer_kwargs: dict = {}
        self.lr = lr
        self.tau = tau
        self.actor = nn.Sequential(nn.Linear(OBS_DIM, hidden), nn.Tanh(), nn.Linear(hidden, ACT_DIM))
        self.critic = nn.Sequential(nn.Linear(OBS_DIM + ACT_DIM, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.target_critic = nn.Sequential(
            nn.Linear(OBS_DIM + ACT_DIM, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )
        self.target_critic.load_state_dict(self.critic.state_dict())
        self.target_critic.requires_grad_(False)
        self.updates_seen = 0

    def act(self, td: TensorDict) -> TensorDict:
        """Deterministic policy: writes ``"action"`` [B, ACT_DIM] from ``"observation"`` [B, OBS_DIM]."""
        td["action"] = torch.tanh(self.actor(td["observation"]))
        return td

    def critic_loss(self, batch: TensorDict) -> torch.Tensor:
        obs, action = batch["observation"], batch["action"]
        with torch.no_grad():
            bootstrap = self.target_critic(torch.cat([obs, action], -1)).squeeze(-1)
        q = self.critic(torch.cat([obs, action], -1)).squeeze(-1)
        return F.mse_loss(q, batch["reward"] + 0.1 * bootstrap)

    def actor_loss(self, batch: TensorDict) -> torch.Tensor:
        return F.mse_loss(torch.tanh(self.actor(batch["observation"])), batch["expert_action"])

    def update(self, batch: TensorDict) -> TensorDict:
        """One gradient step on critic and actor; returns detached scalar losses."""
        critic_opt, actor_opt = self.optimizers()
        critic_loss = self.critic_loss(batch)
        critic_opt.zero_grad()
        self.manual_backward(critic_loss)
        critic_opt.step()

        actor_loss = self.actor_loss(batch)
        actor_opt.zero_grad()
        self.manual_backward(actor_loss)
        actor_opt.step()

        with torch.no_grad():
            for target, source in zip(self.target_critic.parameters(), self.critic.parameters()):
                target.lerp_(source, self.tau)
        return TensorDict(loss_critic=critic_loss.detach(), loss_actor=actor_loss.detach())

    def training_step(self, batch: TensorDict, batch_idx: int) -> None:
        self.update(batch)
        self.updates_seen += 1

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.critic.parameters(), lr=self.lr, **self.optimizer_kwargs),
            torch.optim.Adam(self.actor.parameters(), lr=self.lr, **self.optimizer_kwargs),
        ]


class _Stream:
    """Infinite seeded stream: observations -> module.act (collection) -> batches with targets."""

    def __init__(self, datamodule: ToyDataModule) -> None:
        self.dm = datamodule
        self.generator = torch.Generator().manual_seed(datamodule.seed)
        self.w_reward = torch.randn(OBS_DIM + ACT_DIM, generator=self.generator)
        self.w_expert = torch.randn(OBS_DIM, ACT_DIM, generator=self.generator)

    def __iter__(self) -> Iterator[TensorDict]:
        return self

    def __next__(self) -> TensorDict:
        dm, g = self.dm, self.generator
        obs = torch.randn(dm.batch_size, OBS_DIM, generator=g)
        td = TensorDict(observation=obs.to(dm.module.device), batch_size=[dm.batch_size])
        with torch.no_grad():
            td = dm.module.act(td)
        dm.frames += dm.batch_size
        dm.action_dtypes.add(td["action"].dtype)
        action = td["action"].float().cpu()
        reward = torch.cat([obs, action], -1) @ self.w_reward
        expert = torch.tanh(obs @ self.w_expert)
        return TensorDict(
            observation=obs, action=action, reward=reward, expert_action=expert, batch_size=[dm.batch_size]
        )


class ToyDataModule(pl.LightningDataModule):
    """Owns the synthetic stream and a ``frames`` counter, like the RL data module owns its collector; its
    progress view (what callbacks read) is itself."""

    def __init__(self, module: ToyProtocolModule, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.module = module
        self.batch_size = batch_size
        self.seed = seed
        self.frames = 0
        self.action_dtypes: set[torch.dtype] = set()

    @property
    def progress(self) -> ToyDataModule:
        return self

    def train_dataloader(self) -> _Stream:
        return _Stream(self)


class MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call in memory: ``self.records`` is a list of ``(step, metrics)``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.records.append((step, dict(metrics)))

    def values(self, key: str) -> list[float]:
        return [metrics[key] for _, metrics in self.records if key in metrics]


class WithoutHotPaths(ToyProtocolModule):
    """Lacks the hot-path protocol."""

    hot_paths = None


class WithCompileRegions(ToyProtocolModule):
    """The same module, whose two losses ``TorchCompile`` compiles in place of ``update``."""

    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("critic_loss", "actor_loss")}


class WithUnknownRegion(ToyProtocolModule):
    """Names a compile region it does not have."""

    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("value_loss",)}


class WithoutOptimizerKwargs(ToyProtocolModule):
    """Lacks the optimizer protocol (builds its optimizers with fixed arguments)."""

    def __init__(self) -> None:
        super().__init__()
        del self.optimizer_kwargs

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(self.critic.parameters()), torch.optim.Adam(self.actor.parameters())]


def fit_toy(
    callbacks: list[pl.Callback] | None = None,
    steps: int = 12,
    seed: int = 0,
    logger: Logger | bool = False,
    module_cls: type[ToyProtocolModule] = ToyProtocolModule,
    **trainer_kwargs,
) -> tuple[ToyProtocolModule, ToyDataModule, pl.Trainer]:
    """Seeded short fit (CPU unless ``accelerator`` says otherwise); returns module, data module, trainer."""
    pl.seed_everything(seed, verbose=False)
    module = module_cls()
    datamodule = ToyDataModule(module, seed=seed)
    trainer = pl.Trainer(
        accelerator=trainer_kwargs.pop("accelerator", "cpu"),
        devices=1,
        max_epochs=1,
        limit_train_batches=steps,
        callbacks=callbacks or [],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer_kwargs,
    )
    trainer.fit(module, datamodule=datamodule)
    return module, datamodule, trainer


@functools.cache
def _baseline(steps: int, seed: int, accelerator: str) -> dict[str, torch.Tensor]:
    module, _, _ = fit_toy(steps=steps, seed=seed, accelerator=accelerator)
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def baseline_state(steps: int = 12, seed: int = 0, accelerator: str = "cpu") -> dict[str, torch.Tensor]:
    """Parameters after a plain fit with no callbacks (computed once per process)."""
    return _baseline(steps, seed, accelerator)


def assert_state_close(
    module: nn.Module, expected: dict[str, torch.Tensor], atol: float, rtol: float = 0.0
) -> None:
    """Every state-dict entry of ``module`` matches ``expected`` within ``atol + rtol * |expected|``."""
    state = module.state_dict()
    assert state.keys() == expected.keys()
    for key, value in state.items():
        torch.testing.assert_close(value.float().cpu(), expected[key].float(), atol=atol, rtol=rtol, msg=key)


def max_abs_diff(module: nn.Module, expected: dict[str, torch.Tensor]) -> float:
    """Largest absolute parameter difference to ``expected``."""
    return max(
        (v.float().cpu() - expected[k].float()).abs().max().item() for k, v in module.state_dict().items()
    )
