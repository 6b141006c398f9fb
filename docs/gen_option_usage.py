"""Draws the option usage of a SAC-with-options Pendulum policy over one episode (docs/options.md).

Run by hand after a Pendulum run (the image is committed, the docs build does not train):

    python docs/gen_option_usage.py --ckpt runs/sac_options_pendulum/<stamp>/checkpoints/last.ckpt

It loads the checkpoint with the framework's safe loader and plays one Pendulum-v1 episode (seed
``--seed``) twice: with the deterministic ``act_eval`` (greedy options, mean actions: what evaluation
scores) and with the exploring ``act`` (options drawn from the softmax over ``Q_Ω``, terminations drawn
from ``β``, actions sampled: what training collects). For each it draws the pole angle and the torque
against time, coloured by the active option, and the share of the steps each option was active. Writes
``docs/images/options_pendulum_usage.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from rl_lightning.cli.run import build_module, env_config
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

OUT = Path(__file__).resolve().parent / "images" / "options_pendulum_usage.png"


def load(path: str) -> torch.nn.Module:
    ckpt = load_checkpoint(path)
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = build_module(saved, env_config(saved))
    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval()


def episode(module: torch.nn.Module, seed: int, explore: bool) -> dict[str, np.ndarray]:
    """One Pendulum episode: angle (0 = upright), torque, option and reward per step."""
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=seed)
    torch.manual_seed(seed)
    if explore:
        module.age.reset()  # a fresh option state for env 0 (the module acts for algo.num_envs envs)
    n = module.active.num_envs if explore else 1
    rows: dict[str, list] = {"angle": [], "torque": [], "option": [], "reward": []}
    done, t = False, 0
    while not done:
        td = TensorDict(
            {
                "observation": torch.as_tensor(obs, dtype=torch.float32).expand(n, -1),
                "step_count": torch.full((n, 1), t),
            },
            [n],
        )
        out = module.act(td) if explore else module.act_eval(td)
        action = out["action"][0].numpy()
        theta = env.unwrapped.state[0]
        rows["angle"].append(np.degrees(np.arctan2(np.sin(theta), np.cos(theta))))
        rows["torque"].append(float(action[0]))
        rows["option"].append(int(out["option"][0]))
        obs, reward, terminated, truncated, _ = env.step(action)
        rows["reward"].append(reward)
        done, t = terminated or truncated, t + 1
    return {k: np.asarray(v) for k, v in rows.items()}


def draw(runs: dict[str, dict[str, np.ndarray]], k: int, title: str) -> plt.Figure:
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(
        3, len(runs), figsize=(6.5 * len(runs), 7.5), gridspec_kw={"height_ratios": [3, 3, 1.2]}
    )
    for col, (name, run) in enumerate(runs.items()):
        steps = np.arange(len(run["option"]))
        for row, key, label in ((0, "angle", "pole angle (deg, 0 = up)"), (1, "torque", "torque")):
            ax = axes[row, col]
            ax.plot(steps, run[key], color="0.75", lw=1, zorder=1)
            for o in range(k):
                on = run["option"] == o
                ax.scatter(steps[on], run[key][on], s=9, color=colors[o % 10], label=f"option {o}", zorder=2)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0, col].set_title(f"{name}: return {run['reward'].sum():.0f}")
        ax = axes[2, col]
        share = np.bincount(run["option"], minlength=k) / len(run["option"])
        switches = int((np.diff(run["option"]) != 0).sum())
        left = 0.0
        for o in range(k):
            ax.barh(0, share[o], left=left, color=colors[o % 10])
            if share[o] > 0.06:
                ax.text(left + share[o] / 2, 0, f"{share[o]:.0%}", ha="center", va="center", color="white")
            left += share[o]
        ax.set_xlim(0, 1)
        ax.set_yticks([])
        ax.set_xlabel(f"share of the {len(steps)} steps per option ({switches} switches)")
    axes[0, 0].legend(loc="upper right", fontsize=8, markerscale=1.5)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True, help="a sac_options_pendulum checkpoint")
    parser.add_argument("--seed", type=int, default=0, help="the episode's seed")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    module = load(args.ckpt)
    runs = {
        "evaluation (greedy options, mean actions)": episode(module, args.seed, explore=False),
        "exploring (sampled options and actions)": episode(module, args.seed, explore=True),
    }
    fig = draw(runs, module.num_options, f"SAC with {module.num_options} options on Pendulum-v1, one episode")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
