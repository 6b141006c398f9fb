"""The value-based base: one prioritized-replay reduction for every member, one flat set of
hyperparameters."""

from __future__ import annotations

import copy
import dataclasses
import inspect

import pytest
import torch
from helpers.batches import discrete_specs, transitions
from helpers.batches import quantile_module as make_quantile
from omegaconf import OmegaConf

from rl_lightning.algos import C51, DQN, IQN, QRDQN, ValueBased, ValueBasedHParams
from rl_lightning.cli.config import CliError
from rl_lightning.cli.validate import check_config
from rl_lightning.nn.noisy import reset_noise

B = 16
MEMBERS = ["dqn", "dueling_dqn", "c51", "rainbow", "qrdqn", "iqn"]


def make(name: str, **kw) -> ValueBased:
    if name in ("dqn", "dueling_dqn"):
        torch.manual_seed(0)
        obs, act = discrete_specs()
        return DQN(obs, act, hidden_sizes=(32, 32), dueling=name == "dueling_dqn", **kw)
    return make_quantile(name, **kw)


@pytest.mark.parametrize("name", MEMBERS)
def test_every_member_steps_on_the_mean_of_the_weighted_per_sample_losses(name: str) -> None:
    """``update`` on a prioritized sample reports ``mean(w * L)`` and takes the optimizer step of its
    gradient: the same weights as a plain Adam step on that loss, computed by hand from the member's
    per-sample losses. A member that reduced otherwise (``sum(w * L) / sum(w)``, no weights) fails. The
    new priorities are the member's (the per-sample loss of the distributional members, DQN's TD error)."""
    lr = 0.01
    m = make(name, grad_clip=None, lr=lr, target_update="hard", hard_update_every=1000)
    ref = copy.deepcopy(m)
    obs_dim, n_actions = int(m.obs_shape[0]), m.n_actions
    td = transitions(B, obs_dim, n_actions, 3)
    td["index"] = torch.arange(B)
    w = torch.linspace(0.1, 1.0, B)
    td["priority_weight"] = w
    torch.manual_seed(7)
    out = m.update(td.clone())
    torch.manual_seed(7)
    if ref.noisy:  # the update draws fresh noise first
        reset_noise(ref.online)
        reset_noise(ref.target)
    per_sample, priority, _ = ref.per_sample_loss(td.clone())
    expected = (w * per_sample).mean()
    torch.testing.assert_close(out["loss"], expected.detach())
    # The member's priorities come back under the sample's replay indices; a uniform sample carries none.
    assert torch.equal(out["priority", "index"], td["index"])
    torch.testing.assert_close(out["priority", "value"], priority.detach())
    assert "priority" not in make(name).update(td.exclude("index", "priority_weight")).keys()
    assert not torch.allclose(out["loss"], (w * per_sample).sum().detach() / w.sum(), rtol=1e-3)
    opt = torch.optim.Adam(ref.online.parameters(), lr=lr, eps=ref.config.adam_eps, foreach=True)
    expected.backward()
    opt.step()
    for a, b in zip(m.online.parameters(), ref.online.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cls", [DQN, C51, QRDQN, IQN])
def test_every_shared_hyperparameter_is_a_flat_argument_recorded_in_hparams(cls: type) -> None:
    """Hydra and the CLI see each member's own arguments and the shared ones as one flat signature (with
    their types, for the CLI's check); ``hparams`` records every one, defaults included."""
    params = inspect.signature(cls).parameters
    shared = [f.name for f in dataclasses.fields(ValueBasedHParams)]
    assert set(shared) <= set(params)
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())  # unknown keys are still caught
    obs, act = discrete_specs()
    module = cls(obs, act, hidden_sizes=[32, 32], lr=0.01)
    assert set(params) - {"observation_spec", "action_spec"} == set(module.hparams)
    assert module.hparams.lr == module.config.lr == 0.01 and module.hparams.gamma == 0.99
    assert module.hparams.hidden_sizes == [32, 32]
    target = f"{cls.__module__}.{cls.__name__}"
    with pytest.raises(CliError, match=r"algo\.lr"):
        check_config(OmegaConf.create({"algo": {"_target_": target, "lr": "fast"}}))
    with pytest.raises(CliError, match=r"not an argument of .*did you mean algo\.gamma"):
        check_config(OmegaConf.create({"algo": {"_target_": target, "gama": 0.9}}))


def test_shared_hyperparameters_are_checked_in_one_place() -> None:
    obs, act = discrete_specs()
    for cls in (DQN, C51, QRDQN, IQN):
        with pytest.raises(ValueError, match=r"algo\.target_update"):
            cls(obs, act, target_update="sometimes")
        with pytest.raises(ValueError, match=r"algo\.optimizer='sgd'"):
            cls(obs, act, optimizer="sgd")
        with pytest.raises(ValueError, match=r"algo\.gamma"):
            cls(obs, act, gamma=1.5)
    with pytest.raises(TypeError, match="lrr"):
        DQN(obs, act, lrr=0.1)
