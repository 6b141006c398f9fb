"""`export` writes the deterministic policy as a standalone file that acts exactly as `act_eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rl_lightning.cli import compose, main
from rl_lightning.cli.export import export_module
from rl_lightning.cli.run import build_module, env_config

TINY_TDMPC2 = [
    "algo.model_size=1M",
    "algo.latent_dim=16",
    "algo.mlp_dim=16",
    "algo.enc_dim=16",
    "algo.mpc=false",
]
SMALL = ["algo.hidden_sizes=[32,32]"]
CASES = {
    "dqn_cartpole": [],
    "tdmpc2_pendulum": TINY_TDMPC2,
    "sac_pendulum": SMALL,
    "td3_pendulum": SMALL,
    "ddpg_pendulum": SMALL,
    "sac_discrete_cartpole": SMALL,
    "c51_cartpole": SMALL,
    "qrdqn_cartpole": SMALL,
    "iqn_cartpole": SMALL,
    "rainbow_cartpole": SMALL,  # noisy layers: act_eval and the export use the mean weights
    "aciqn_pendulum": ["algo.actor_hidden_sizes=[32,32]", "algo.critic_hidden_sizes=[32,32]"],
    # CNN policies over uint8 images: the exported network scales the raw pixel values itself.
    "dqn_minatar": [],
    "rainbow_minatar": [],
    "iqn_minatar": [],
    "dqn_atari_cpu": [],
}


def observations(module: torch.nn.Module, n: int = 64) -> torch.Tensor:
    """Float observations: Gaussian for vector envs, pixel values (float32, the export's input) for images."""
    torch.manual_seed(3)
    spec = module.observation_spec["observation"]
    if spec.dtype == torch.uint8:
        return torch.randint(0, int(spec.space.high.max()) + 1, (n, *spec.shape[1:])).float()
    return torch.randn(n, *spec.shape[1:]) * 2


def built(overrides: list[str]) -> torch.nn.Module:
    """The module of ``overrides`` with every parameter moved by noise.

    Freshly initialised, QR-DQN's and IQN's networks choose the same action for every observation (the
    output biases dominate), which a wrong export would match as well; moved, the actions vary.
    """
    cfg = compose(["device=cpu", *overrides])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg)).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p), alpha=0.3)
    return module


def act_eval(module: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    return module.act_eval(TensorDict({"observation": obs}, [len(obs)]))["action"]


def exported_actions(module: torch.nn.Module, obs: torch.Tensor, fmt: str, tmp_path: Path) -> torch.Tensor:
    """The actions of ``module``'s exported policy (written as ``fmt``, loaded back) for ``obs``."""
    out = tmp_path / f"policy.{fmt}"
    export_module(module.export_policy(), obs[:1], fmt, out)
    if fmt == "torchscript":
        return torch.jit.load(str(out))(obs)
    ort = pytest.importorskip("onnxruntime")
    return torch.from_numpy(ort.InferenceSession(str(out)).run(None, {"observation": obs.numpy()})[0])


def assert_same_actions(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape  # a batch of 64, though traced on a batch of 1
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(got.to(expected.dtype), expected)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_policy_acts_as_act_eval(name: str, fmt: str, tmp_path: Path) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    module = built([f"+experiment={name}", *CASES[name]])
    obs = observations(module)
    expected = act_eval(module, obs)
    assert expected.unique(dim=0).shape[0] > 1  # not one action for every observation
    assert_same_actions(exported_actions(module, obs, fmt, tmp_path), expected)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("risk", ["cvar=0.25", "wang=-0.75", "cpw=0.71", "pow=-2.0"])
def test_exported_iqn_applies_the_risk_distortion_of_act_eval(risk: str, fmt: str, tmp_path: Path) -> None:
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    name, eta = risk.split("=")
    neutral = built(["+experiment=iqn_cartpole", *SMALL])
    module = built(["+experiment=iqn_cartpole", *SMALL, f"algo.risk={name}", f"algo.risk_param={eta}"])
    obs = observations(module, 256)
    expected = act_eval(module, obs)
    assert_same_actions(exported_actions(module, obs, fmt, tmp_path), expected)
    # The same weights acting risk-neutrally choose otherwise somewhere: the test sees the distortion.
    assert torch.equal(neutral.online.psi[0].weight, module.online.psi[0].weight)
    assert not torch.equal(act_eval(neutral, obs), expected)


def test_tdmpc2_with_its_planner_says_why_it_cannot_be_exported() -> None:
    cfg = compose(["+experiment=tdmpc2_pendulum", "device=cpu", *TINY_TDMPC2[:-1]])
    with pytest.raises(NotImplementedError, match="acts by planning"):
        build_module(cfg, env_config(cfg)).export_policy()


def test_export_command_writes_a_file_beside_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    fit = ["fit", "+experiment=dqn_cartpole", "+debug=quick", "device=cpu", "total_frames=300"]
    assert main(fit) == 0
    ckpt = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["last_ckpt"]
    assert main(["export", f"ckpt={ckpt}"]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["out"] == str(Path(ckpt).with_suffix(".pt")) and Path(info["out"]).is_file()
    assert torch.jit.load(info["out"])(torch.zeros(3, 4)).shape == (3,)
    assert main(["export", f"ckpt={ckpt}", "export.format=zip"]) == 2
