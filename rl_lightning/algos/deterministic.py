"""What the deterministic actor-critics (TD3 and DDPG in ``td3.py``, AC-IQN in ``quantile/aciqn.py``) share
besides their hyperparameters: a tanh actor in ``[-1, 1]`` explored with clipped Gaussian noise, its
deterministic policy, transitions from the replay, and the host-side schedule of the delayed actor.

The schedule: ``prepare_sample`` counts updates in a Python int and marks ``policy_delay - 1`` of every
``policy_delay`` batches critic-only (:func:`~rl_lightning.algos.common.mark_critic_only`), so no tensor is
read and no Python branch depends on a tensor value; the counter is saved in checkpoints.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase
from torch import nn

from rl_lightning.algos.base import TRANSITION_KEYS, ReplayRequirements
from rl_lightning.algos.common import ActionScaler, ScaledActorPolicy, mark_critic_only, without_grad

__all__ = ["DeterministicActorMixin"]


class DeterministicActorMixin:
    """Mixed in before :class:`~rl_lightning.algos.base.RLModule`.

    The class provides ``actions`` (an :class:`ActionScaler`), ``policy_delay`` (critic steps per actor
    step), ``num_updates`` (0 at construction), ``hparams.gamma`` and ``hparams.exploration_noise``, and
    names its actor module (``observation [N, obs_dim] -> action [N, A]`` in ``[-1, 1]``) in
    ``actor_attribute``.
    """

    #: Checkpoint entry of the update counter (each family keeps the name its checkpoints carry).
    update_counter_key: ClassVar[str]
    #: The attribute holding the actor module.
    actor_attribute: ClassVar[str]
    actions: ActionScaler
    policy_delay: int
    num_updates: int
    hparams: Any

    def _actor_action(self, observation: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.actor_attribute)(observation.float())

    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(
            discount=self.hparams.gamma, n_step=True, prioritized=True, sample_keys=TRANSITION_KEYS
        )

    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """The actor's actions ``[N, A]`` plus Gaussian noise, clipped to the bounds."""
        action = self._actor_action(td.get("observation"))
        noise = torch.randn_like(action) * self.hparams.exploration_noise
        td.set("action", self.actions.to_env((action + noise).clamp(-1.0, 1.0)))
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """The actor's action, without noise."""
        td.set("action", self.actions.to_env(self._actor_action(td.get("observation"))))
        return td

    def export_policy(self) -> nn.Module:
        """The actor's action without noise, in the env's bounds (what ``act_eval`` does)."""
        return ScaledActorPolicy(getattr(self, self.actor_attribute), self.actions)

    def prepare_sample(self, batch: TensorDictBase) -> TensorDictBase:
        """Counts an update and marks ``batch`` critic-only unless an actor step is due (host-side).

        Returns:
            ``batch``, or a shallow copy of it carrying :data:`~rl_lightning.algos.common.CRITIC_ONLY`.
        """
        self.num_updates += 1
        return mark_critic_only(batch, self.num_updates, self.policy_delay)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)  # type: ignore[misc]
        checkpoint[self.update_counter_key] = self.num_updates

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        self.num_updates = int(checkpoint.get(self.update_counter_key, 0))
