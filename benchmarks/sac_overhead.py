"""Framework overhead: the SAC update and acting through rl_lightning vs a hand-written PyTorch loop.

Both sides do the same math on the same batch: a tanh-squashed Gaussian actor and two critics, [256, 256] MLPs
each; soft clipped double-Q targets from target critics (next actions from the current actor), summed MSE
critic losses, the actor loss against detached critics, the temperature loss towards ``-|A|``, one backward of
the summed losses, three Adam steps (actor, critics, temperature) and a Polyak update of the target critics.
The rl_lightning side is the real path: ``Trainer.fit`` with manual optimization calling ``training_step`` ->
``SAC.update`` (tensor losses with ``SACLoss``'s math, the critics one batched MLP), with the default
``DirectSteps`` callback and ``UpdateFeedback`` logging every 100 updates, timed from the 11th batch to the
last (the fit's setup and teardown excluded); acting is ``SAC.act``. The hand-written side is CleanRL-style
code (two separate critic modules). A third timing calls ``SAC.update`` directly, without a Trainer, which
splits the overhead into the module's share (its losses and networks against the hand-written ones) and the
training loop's (Lightning's loop, optimizer wrappers, ``UpdateFeedback``). Warm-up iterations are excluded;
the sides alternate in blocks in one process and the best block of each is kept (the least disturbed by other
load). Both wall-clock and process CPU time are reported: with one torch thread the CPU time counts this
process's own work, the steadier figure on a machine shared with other jobs.

    python benchmarks/sac_overhead.py [--updates 1000] [--blocks 5] [--compile]

``--compile`` also times the rl_lightning update under the ``TorchCompile`` callback (compilation excluded)
against the same eager hand-written loop.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import lightning as L
import torch
import torch.nn.functional as F
from _common import Round, write
from tensordict import TensorDict
from torch import nn
from torch.func import functional_call
from torchrl.data import Bounded, Composite, Unbounded

from callbacks import DirectSteps, TorchCompile
from rl_lightning.algos.sac import SAC
from rl_lightning.training.feedback import UpdateFeedback

OBS, ACT, BATCH, HIDDEN, GAMMA, LR, TAU = 3, 1, 256, (256, 256), 0.99, 1e-3, 0.005
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def make_batch(seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(BATCH, 1, generator=g) < 0.05
    return TensorDict(
        {
            "observation": torch.randn(BATCH, OBS, generator=g),
            "action": 4 * torch.rand(BATCH, ACT, generator=g) - 2,
            "next": {
                "observation": torch.randn(BATCH, OBS, generator=g),
                "reward": torch.randn(BATCH, 1, generator=g),
                "terminated": term,
                "truncated": torch.zeros(BATCH, 1, dtype=torch.bool),
                "done": term.clone(),
            },
        },
        batch_size=[BATCH],
    )


class _Stream:
    """``n`` rounds of one update on the same batch: the real stream of ``sac_pendulum`` (one env step, then
    the update it grants, per Lightning batch). The data path is measured by benchmarks/collection.py."""

    def __init__(self, batch: TensorDict, n: int) -> None:
        self.batch, self.n = batch, n

    def __iter__(self):
        for _ in range(self.n):
            yield Round(self.batch, 1)


class _DM(L.LightningDataModule):
    def __init__(self, batch: TensorDict, n: int) -> None:
        super().__init__()
        self.stream = _Stream(batch, n)
        self.frames, self.episodes = 0, 0

    def train_dataloader(self):
        return self.stream

    def pop_episodes(self):
        return []


def make_module() -> SAC:
    torch.manual_seed(0)
    obs = Composite(observation=Unbounded((1, OBS)), shape=(1,))
    return SAC(
        obs, Bounded(-2.0, 2.0, shape=(1, ACT)), hidden_sizes=HIDDEN, actor_lr=LR, critic_lr=LR, alpha_lr=LR
    )


class _Clock(L.Callback):
    """Wall and CPU time from the start of batch ``skip`` to the end of the last batch: the steady-state
    loop (Lightning's per-batch work included), without the fit's setup and teardown."""

    def __init__(self, skip: int) -> None:
        self.skip, self.start, self.end, self.batches = skip, (0.0, 0.0), (0.0, 0.0), 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.skip:
            self.start = (time.perf_counter(), time.process_time())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end, self.batches = (time.perf_counter(), time.process_time()), batch_idx + 1 - self.skip


def time_framework(module: SAC, batch: TensorDict, n: int, callbacks: tuple = ()) -> tuple[float, float]:
    clock = _Clock(skip=10)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[*callbacks, DirectSteps(), UpdateFeedback(log_every_n_updates=100), clock],
    )
    trainer.fit(module, datamodule=_DM(batch, n + clock.skip))
    return tuple((e - s) / clock.batches for s, e in zip(clock.start, clock.end))


def time_hand(run, n: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    run(n)
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def _mlp(n_in: int, n_out: int) -> nn.Sequential:
    layers, width = [], n_in
    for h in HIDDEN:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, n_out))


def hand_written(batch: TensorDict, foreach: bool | None):
    """The same update in plain PyTorch; returns a function that runs ``n`` updates, and the actor.

    ``foreach``: Adam's implementation, the one the module's optimizers use (a setting, not overhead).
    """
    torch.manual_seed(0)
    actor, q1, q2 = _mlp(OBS, 2 * ACT), _mlp(OBS + ACT, 1), _mlp(OBS + ACT, 1)
    q1_target, q2_target = copy.deepcopy(q1).requires_grad_(False), copy.deepcopy(q2).requires_grad_(False)
    log_alpha = torch.zeros((), requires_grad=True)
    critic_params = [*q1.parameters(), *q2.parameters()]
    target_params = [*q1_target.parameters(), *q2_target.parameters()]
    opt_actor = torch.optim.Adam(actor.parameters(), lr=LR, foreach=foreach)
    opt_critic = torch.optim.Adam(critic_params, lr=LR, foreach=foreach)
    opt_alpha = torch.optim.Adam([log_alpha], lr=LR, foreach=foreach)
    obs, nobs = batch["observation"], batch["next", "observation"]
    act = (batch["action"] / 2).clamp(-1, 1)
    rew, notdone = batch["next", "reward"], (~batch["next", "terminated"]).float()
    half_log_2pi = 0.5 * math.log(2 * math.pi)

    def policy(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, log_std = actor(o).chunk(2, -1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        std = log_std.exp()
        x = loc + std * torch.randn_like(loc)
        log_prob = (-0.5 * ((x - loc) / std) ** 2 - log_std - half_log_2pi).sum(-1)
        log_prob = log_prob - (2 * (math.log(2) - x - F.softplus(-2 * x))).sum(-1)
        return torch.tanh(x), log_prob

    def run(n: int) -> None:
        for _ in range(n):
            alpha = log_alpha.detach().exp()
            with torch.no_grad():
                next_action, next_log_prob = policy(nobs)
                x = torch.cat([nobs, next_action], -1)
                soft_q = torch.min(q1_target(x), q2_target(x)) - alpha * next_log_prob.unsqueeze(-1)
                y = rew + GAMMA * notdone * soft_q
            x = torch.cat([obs, act], -1)
            loss_q = F.mse_loss(q1(x), y) + F.mse_loss(q2(x), y)
            action, log_prob = policy(obs)
            x = torch.cat([obs, action], -1)
            detached = [{k: v.detach() for k, v in q.named_parameters()} for q in (q1, q2)]
            q_pi = torch.min(functional_call(q1, detached[0], (x,)), functional_call(q2, detached[1], (x,)))
            loss_pi = (alpha * log_prob.unsqueeze(-1) - q_pi).mean()
            loss_alpha = (-log_alpha * (log_prob.detach() - ACT)).mean()
            for opt in (opt_actor, opt_critic, opt_alpha):
                opt.zero_grad()
            (loss_q + loss_pi + loss_alpha).backward()
            for opt in (opt_actor, opt_critic, opt_alpha):
                opt.step()
            with torch.no_grad():
                torch._foreach_lerp_(target_params, critic_params, TAU)

    return run, actor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument("--acts", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument(
        "--compile", action="store_true", help="also time the update under the TorchCompile callback"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    batch = make_batch()

    module = make_module()
    foreach = module.configure_optimizers()[0].defaults.get("foreach")
    run_hand, actor_hand = hand_written(batch, foreach)
    time_framework(module, batch, 100)  # warm-up
    run_hand(100)
    # The same module's update called directly (no Trainer): splits the overhead into the TorchRL loss's
    # share and the training loop's.
    direct_module = make_module()
    run_direct = lambda n: [direct_module.update(batch) for _ in range(n)]  # noqa: E731
    run_direct(100)
    fw, hw, dw = [], [], []  # (wall, cpu) seconds per update of each block
    for _ in range(args.blocks):
        fw.append(time_framework(module, batch, args.updates))
        hw.append(time_hand(run_hand, args.updates))
        dw.append(time_hand(run_direct, args.updates))

    compiled = []
    if args.compile:
        compile_cb = (TorchCompile(mode="default", paths=["update"]),)
        time_framework(module, batch, 20, compile_cb)  # compiles; later fits reuse the compiled code
        compiled = [time_framework(module, batch, args.updates, compile_cb) for _ in range(args.blocks)]

    obs_td = TensorDict({"observation": torch.randn(args.num_envs, OBS)}, [args.num_envs])

    def hand_act(o: torch.Tensor) -> torch.Tensor:
        loc, log_std = actor_hand(o).chunk(2, -1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return 2 * torch.tanh(loc + log_std.exp() * torch.randn_like(loc))

    fa, ha = [], []
    with torch.no_grad():
        for _ in range(args.blocks):
            fa.append(time_hand(lambda n: [module.act(obs_td) for _ in range(n)], args.acts))
            ha.append(time_hand(lambda n: [hand_act(obs_td["observation"]) for _ in range(n)], args.acts))

    def best(blocks: list[tuple[float, float]], i: int) -> float:
        return min(b[i] for b in blocks) * 1e6

    result = {
        "command": "python benchmarks/sac_overhead.py " + " ".join(sys.argv[1:]),
        # Wall clock of the best block, and the process's CPU time (one torch thread, so it counts this
        # process's work only: the robust figure on a machine shared with other jobs).
        "update_us": {"rl_lightning": best(fw, 0), "hand_written": best(hw, 0)},
        "update_ratio": best(fw, 0) / best(hw, 0),
        "update_cpu_us": {"rl_lightning": best(fw, 1), "hand_written": best(hw, 1)},
        "update_cpu_ratio": best(fw, 1) / best(hw, 1),
        "module_update_without_trainer_cpu_us": best(dw, 1),
        "loss_share_cpu_ratio": best(dw, 1) / best(hw, 1),
        "loop_share_cpu_ratio": best(fw, 1) / best(dw, 1),
        "act_us": {"rl_lightning": best(fa, 0), "hand_written": best(ha, 0)},
        "act_ratio": best(fa, 0) / best(ha, 0),
        "act_cpu_ratio": best(fa, 1) / best(ha, 1),
        "settings": vars(args) | {"batch": BATCH, "hidden": HIDDEN, "threads": 1, "adam_foreach": foreach},
    }
    if compiled:
        result["compiled_update_us"] = best(compiled, 0)
        result["compiled_update_cpu_us"] = best(compiled, 1)
        result["compiled_update_cpu_ratio"] = best(compiled, 1) / best(hw, 1)
    path = write("sac_overhead", result)
    print(
        f"update: {result['update_us']['rl_lightning']:.0f} us vs "
        f"{result['update_us']['hand_written']:.0f} us "
        f"-> ratio {result['update_ratio']:.2f} (CPU time: {result['update_cpu_ratio']:.2f})"
    )
    print(
        f"act:    {result['act_us']['rl_lightning']:.1f} us vs {result['act_us']['hand_written']:.1f} us "
        f"-> ratio {result['act_ratio']:.2f}"
    )
    print(path)


if __name__ == "__main__":
    main()
