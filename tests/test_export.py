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
CASES = {
    "dqn_cartpole": [],
    "tdmpc2_pendulum": TINY_TDMPC2,
}


def observations(module: torch.nn.Module, n: int = 64) -> torch.Tensor:
    torch.manual_seed(3)
    spec = module.observation_spec["observation"]
    return torch.randn(n, *spec.shape[1:]) * 2


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_exported_policy_acts_as_act_eval(name: str, fmt: str, tmp_path: Path) -> None:
    if fmt == "onnx":
        ort = pytest.importorskip("onnxruntime")
    cfg = compose([f"+experiment={name}", "device=cpu", *CASES[name]])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg)).eval()
    obs = observations(module)
    expected = module.act_eval(TensorDict({"observation": obs}, [len(obs)]))["action"]
    out = tmp_path / f"policy.{fmt}"
    export_module(module.export_policy(), obs[:1], fmt, out)
    if fmt == "torchscript":
        got = torch.jit.load(str(out))(obs)
    else:
        got = torch.from_numpy(ort.InferenceSession(str(out)).run(None, {"observation": obs.numpy()})[0])
    assert got.shape == expected.shape  # a batch of 64, though traced on a batch of 1
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(got.to(expected.dtype), expected)


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
