"""Optimization callbacks change speed, not results: PPO, discrete (CartPole) and continuous (Pendulum).

The harness is the one of ``tests/helpers/equivalence.py``: the module built from its config with a fixed
seed, ``K`` updates by a real ``lightning.Trainer`` on minibatches of one prepared rollout, ``act`` on fixed
observations after every update (sampled actions draw the same random numbers with and without a
callback, so they compare too).

- ``FusedOptimizer``, ``DirectSteps`` and ``TorchCompile`` (``act``; ``update``'s losses, ``slow``):
  float32 rounding only, ``DirectSteps`` bit for bit.
- ``MixedPrecision`` (bf16): the first update's loss, the direction of the parameter change and the actions
  within the bounds measured below.
"""

from __future__ import annotations

from helpers.equivalence import Bf16Bounds, FamilyEquivalence, ppo_data

SMALL = ["device=cpu", "algo.hidden_sizes=[32,32]"]
EXPERIMENTS = {
    "ppo": ["+experiment=ppo_cartpole", *SMALL],
    "ppo_continuous": ["algo=ppo", "env=pendulum", *SMALL],
}


class TestPPOCallbacks(FamilyEquivalence):
    EXPERIMENTS = EXPERIMENTS
    EXACT_ACTIONS = frozenset({"ppo"})  # sampled categorical actions; Gaussian ones compare to EXACT_ATOL
    # Measured here (CPU, torch 2.13), bf16 against float32 after K updates: the first update's loss within
    # 0.13% (CartPole) and 0.01% (Pendulum); the parameter change has a cosine of 0.99998 with float32's and
    # every larger-than-median entry keeps its sign; all sampled CartPole actions are equal, Pendulum's move
    # by 0.02% of the action range. The bounds allow about 10x to 20x that.
    BF16 = Bf16Bounds(cosine=0.99, signs=0.98, actions=0.95, action_gap=0.005)
    make_data = staticmethod(ppo_data)

    def loss_key(self, name: str) -> str:
        return "loss"
