"""Hyperparameters shared by construction (``rl_lightning/algos/hparams.py``): the constructors that take a
group's keys as ``**shared`` still publish, check and record every key, flat, as when they listed them."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos import ACIQN, DDPG, TD3, TDMPC2, DiscreteSAC, SACOptions
from rl_lightning.algos.hparams import ActorCriticHParams, SoftActorCriticHParams
from rl_lightning.algos.sac import SAC
from rl_lightning.cli import CliError, compose
from rl_lightning.cli.validate import check_config

OBS = Composite(observation=Unbounded((1, 3)), shape=(1,))
BOX = Bounded(-1.0, 1.0, shape=(1, 2))
TINY_TDMPC2 = {"model_size": "1M", "latent_dim": 16, "num_samples": 16, "num_elites": 4, "num_pi_trajs": 2}
#: Each algorithm that shares a group, its action spec and small settings (a shared key among them).
CASES = {
    "sac": (SAC, BOX, {"hidden_sizes": (8,), "tau": 0.2}),
    "sac_discrete": (DiscreteSAC, Categorical(3, shape=(1,)), {"hidden_sizes": (8,), "alpha_lr": 0.01}),
    "sac_options": (SACOptions, BOX, {"hidden_sizes": (8,), "num_options": 2, "grad_clip": 1.0}),
    "td3": (TD3, BOX, {"hidden_sizes": (8,), "policy_delay": 3, "gamma": 0.9}),
    "ddpg": (DDPG, BOX, {"hidden_sizes": (8,), "exploration_noise": 0.3}),
    "aciqn": (ACIQN, BOX, {"actor_hidden_sizes": (8,), "critic_hidden_sizes": (8, 8), "critic_lr": 1e-3}),
    "tdmpc2": (TDMPC2, BOX, {**TINY_TDMPC2, "rho": 0.4, "horizon": 2}),
}


@pytest.mark.parametrize("name", CASES)
def test_every_argument_is_recorded_flat_with_its_default_and_rebuilds_the_module(name: str) -> None:
    cls, action_spec, kwargs = CASES[name]
    torch.manual_seed(0)
    module = cls(OBS, action_spec, **kwargs)
    params = inspect.signature(cls).parameters
    expected = {k: p.default for k, p in params.items() if k not in ("observation_spec", "action_spec")}
    assert dict(module.hparams) == {**expected, **kwargs}
    # What load_from_checkpoint does with a checkpoint's hyperparameters.
    torch.manual_seed(0)
    again = cls(OBS, action_spec, **dict(module.hparams))
    assert dict(again.hparams) == dict(module.hparams)
    for a, b in zip(module.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_the_signature_lists_the_groups_fields_with_their_types_and_defaults() -> None:
    params = inspect.signature(SAC).parameters
    for field in dataclasses.fields(SoftActorCriticHParams):
        assert params[field.name].default == field.default
        assert params[field.name].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["gamma"].annotation is float
    assert "shared" not in params and "target_entropy" in params
    assert set(inspect.signature(ACIQN).parameters) >= {
        f.name for f in dataclasses.fields(ActorCriticHParams)
    }
    assert {"num_samples", "rho", "horizon", "lr"} <= set(inspect.signature(TDMPC2).parameters)


def test_a_family_base_argument_that_a_subclass_fixes_is_not_recorded() -> None:
    """DDPG is TD3's base with the actor every step: its policy delay is no argument of it, so a
    checkpoint's hyperparameters must not name it."""
    assert "policy_delay" not in DDPG(OBS, BOX).hparams
    assert DDPG(OBS, BOX).policy_delay == 1


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "match"),
    [
        (SAC, {"gama": 0.9}, TypeError, "gama"),
        (TDMPC2, {**TINY_TDMPC2, "num_sample": 3}, TypeError, "num_sample"),
        (SAC, {"gamma": 1.5}, ValueError, r"algo\.gamma=1\.5"),
        (DiscreteSAC, {"alpha_init": 0.0}, ValueError, r"algo\.alpha_init"),
        (SACOptions, {"num_qvalue_nets": 0}, ValueError, r"algo\.num_qvalue_nets"),
        (DDPG, {"exploration_noise": -1.0}, ValueError, r"algo\.exploration_noise"),
        (ACIQN, {"tau": 0.0}, ValueError, r"algo\.tau"),
        (TDMPC2, {**TINY_TDMPC2, "num_elites": 17}, ValueError, "num_elites"),
        (TDMPC2, {**TINY_TDMPC2, "target_entropy": -1.0, "entropy_coef": 0.0}, ValueError, "entropy_coef"),
    ],
)
def test_an_unknown_key_or_a_bad_shared_value_is_one_clear_error(cls, kwargs, error, match) -> None:
    action_spec = Categorical(3, shape=(1,)) if cls is DiscreteSAC else BOX
    with pytest.raises(error, match=match):
        cls(OBS, action_spec, **kwargs)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+experiment=sac_pendulum", "algo.gamma=abc"], "algo.gamma='abc': expected a number"),
        (["+experiment=td3_pendulum", "+algo.gama=0.9"], "did you mean algo.gamma?"),
        (
            ["+experiment=tdmpc2_pendulum", "algo.num_samples=1.5"],
            "algo.num_samples=1.5: expected an integer",
        ),
    ],
)
def test_the_cli_checks_the_shared_keys_types_and_suggests_them(overrides: list[str], message: str) -> None:
    with pytest.raises(CliError, match=message.replace("?", r"\?").replace("(", r"\(")):
        check_config(compose(overrides))
