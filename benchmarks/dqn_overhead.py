"""Framework overhead: the DQN update and acting through rl_lightning vs a hand-written PyTorch loop.

Both sides do the same math on the same batch with the same network and optimizer: a [256, 256] MLP Q-network,
TD(0) targets from a target network, MSE loss, gradient clipping, Adam, a hard target update by ``lerp_``, and
epsilon-greedy acting on a batch of observations. The rl_lightning side is the real path: ``Trainer.fit`` with
manual optimization calling ``training_step`` -> ``DQN.update``, the default ``DirectSteps`` callback, and the
update feedback callback logging every 100 updates; acting is ``DQN.act``. The framework side is timed inside
the fit, from the end of its first round of updates to its end (Trainer set-up excluded); like the real
experience stream, a Lightning batch is a round of up to 64 updates. Warm-up iterations are excluded; the two
sides alternate in blocks in one process and the best block of each is kept (the least disturbed by other
load).

    python benchmarks/dqn_overhead.py [--updates 2000] [--blocks 5]
"""

from __future__ import annotations

import argparse
import copy
import time

import lightning as L
import torch
from _common import Round, write
from tensordict import TensorDict
from torch import nn
from torchrl.data import Categorical, Composite, Unbounded

from callbacks import DirectSteps
from rl_lightning.algos.dqn import DQN
from rl_lightning.data.datamodule import MAX_UPDATES_PER_BATCH
from rl_lightning.training.feedback import UpdateFeedback

OBS, ACTIONS, BATCH, HIDDEN, GAMMA, LR = 4, 2, 64, (256, 256), 0.99, 2.3e-3


def make_batch(seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(BATCH, 1, generator=g) < 0.05
    return TensorDict(
        {
            "observation": torch.randn(BATCH, OBS, generator=g),
            "action": torch.randint(0, ACTIONS, (BATCH,), generator=g),
            "next": {
                "observation": torch.randn(BATCH, OBS, generator=g),
                "reward": torch.ones(BATCH, 1),
                "terminated": term,
                "truncated": torch.zeros(BATCH, 1, dtype=torch.bool),
                "done": term.clone(),
            },
        },
        batch_size=[BATCH],
    )


class _Stream:
    """``n`` updates on the same batch, in rounds like the real stream's (the data path is measured by
    benchmarks/collection.py)."""

    def __init__(self, batch: TensorDict, n: int) -> None:
        self.batch, self.n = batch, n

    def __iter__(self):
        left = self.n
        while left > 0:
            size = min(left, MAX_UPDATES_PER_BATCH)
            left -= size
            yield Round(self.batch, size)


class _DM(L.LightningDataModule):
    def __init__(self, batch: TensorDict, n: int) -> None:
        super().__init__()
        self.stream = _Stream(batch, n)
        self.frames, self.episodes = 0, 0

    def train_dataloader(self):
        return self.stream

    def pop_episodes(self):
        return []


class _Clock(L.Callback):
    """Seconds per update from the end of the first batch (round) to the end of the fit."""

    def __init__(self) -> None:
        self.t0, self.n, self.per_update = 0.0, 0, 0.0
        self.start = MAX_UPDATES_PER_BATCH

    def on_train_batch_end(self, trainer, pl_module, outputs, *args) -> None:
        if self.n == 0:
            self.t0 = time.perf_counter()
        self.n += outputs["updates"]

    def on_train_end(self, trainer, pl_module) -> None:
        self.per_update = (time.perf_counter() - self.t0) / (self.n - self.start)


def make_module() -> DQN:
    torch.manual_seed(0)
    obs = Composite(observation=Unbounded((1, OBS)), shape=(1,))
    return DQN(
        obs,
        Categorical(ACTIONS, shape=(1,)),
        hidden_sizes=HIDDEN,
        lr=LR,
        gamma=GAMMA,
        target_update="hard",
        hard_update_every=10,
    )


def time_framework(module: DQN, batch: TensorDict, n: int) -> float:
    clock = _Clock()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        callbacks=[DirectSteps(), UpdateFeedback(log_every_n_updates=100), clock],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=_DM(batch, n + clock.start))
    return clock.per_update


def hand_written(n_updates: int, batch: TensorDict):
    """The same update in plain PyTorch; returns a function that runs ``n`` updates."""
    torch.manual_seed(0)
    layers, width = [], OBS
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    q = nn.Sequential(*layers, nn.Linear(width, ACTIONS))
    q_target = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=LR)
    obs, act = batch["observation"], batch["action"].unsqueeze(-1)
    nobs, rew = batch["next", "observation"], batch["next", "reward"]
    notdone = (~batch["next", "terminated"]).float()
    step = torch.zeros((), dtype=torch.long)

    def run(n: int) -> None:
        for _ in range(n):
            with torch.no_grad():
                y = rew + GAMMA * notdone * q_target(nobs).max(-1, keepdim=True).values
            loss = ((q(obs).gather(-1, act) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            opt.step()
            step.add_(1)
            w = (step % 10 == 0).float()
            for t, s in zip(q_target.parameters(), q.parameters()):
                t.data.lerp_(s.data, w)

    return run, q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--acts", type=int, default=5000)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batch = make_batch()

    module = make_module()
    run_hand, q_hand = hand_written(args.updates, batch)
    time_framework(module, batch, 200)  # warm-up
    run_hand(200)
    fw, hw = [], []
    for _ in range(args.blocks):
        fw.append(time_framework(module, batch, args.updates))
        t0 = time.perf_counter()
        run_hand(args.updates)
        hw.append((time.perf_counter() - t0) / args.updates)

    obs_td = TensorDict({"observation": torch.randn(args.num_envs, OBS)}, [args.num_envs])
    eps = torch.tensor(0.1)

    def hand_act(o: torch.Tensor) -> torch.Tensor:
        greedy = q_hand(o).argmax(-1)
        rand = torch.randint_like(greedy, ACTIONS)
        return torch.where(torch.rand(greedy.shape) < eps, rand, greedy)

    fa, ha = [], []
    with torch.no_grad():
        for _ in range(args.blocks):
            t0 = time.perf_counter()
            for _ in range(args.acts):
                module.act(obs_td)
            fa.append((time.perf_counter() - t0) / args.acts)
            t0 = time.perf_counter()
            for _ in range(args.acts):
                hand_act(obs_td["observation"])
            ha.append((time.perf_counter() - t0) / args.acts)

    result = {
        "update_us": {"rl_lightning": min(fw) * 1e6, "hand_written": min(hw) * 1e6},
        "update_ratio": min(fw) / min(hw),
        "act_us": {"rl_lightning": min(fa) * 1e6, "hand_written": min(ha) * 1e6},
        "act_ratio": min(fa) / min(ha),
        "settings": vars(args) | {"batch": BATCH, "hidden": HIDDEN, "threads": 1},
    }
    path = write("dqn_overhead", result)
    print(
        f"update: {result['update_us']['rl_lightning']:.0f} us vs "
        f"{result['update_us']['hand_written']:.0f} us "
        f"-> ratio {result['update_ratio']:.2f}"
    )
    print(
        f"act:    {result['act_us']['rl_lightning']:.1f} us vs {result['act_us']['hand_written']:.1f} us "
        f"-> ratio {result['act_ratio']:.2f}"
    )
    print(path)


if __name__ == "__main__":
    main()
