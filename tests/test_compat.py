"""Every private API the project uses has a public fallback that gives the same results.

Each speed-up over a private symbol of torch, TensorDict or TorchRL (``rl_lightning/compat.py`` and the
flags beside the code that uses them) checks that the symbol exists; a release without it takes the public
path. Here each public path runs against the fast one on the same inputs.
"""

from __future__ import annotations

import sys

import pytest
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.samplers import SliceSampler

from callbacks.direct_steps import FAST_STEPS, CountedStep
from rl_lightning import compat
from rl_lightning.cli import process
from rl_lightning.data import replay as replay_module
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer
from rl_lightning.data.slices import FAST_SLICES
from rl_lightning.data.storage import DIRECT_STORAGE


def test_this_release_takes_every_fast_path() -> None:
    """The pinned versions have every private symbol: a failure here means a fast path is lost."""
    assert compat.HAS_FAST_TD and compat.HAS_FOREACH and FAST_STEPS and FAST_SLICES and DIRECT_STORAGE
    assert process.FAST_EXIT


def test_tensordicts_built_without_checks_equal_the_public_ones() -> None:
    entries = {"a": torch.arange(6).reshape(3, 2), "b": TensorDict({"c": torch.ones(3)}, [3])}
    fast = compat.build_td(entries, torch.Size([3]), None, fast=True)
    slow = compat.build_td(entries, torch.Size([3]), None, fast=False)
    assert (fast == slow).all() and fast.batch_size == slow.batch_size
    assert dict(compat.td_entries(fast, fast=True)).keys() == dict(compat.td_entries(fast, fast=False)).keys()
    assert all(compat.td_entries(fast, fast=False)[k] is fast.get(k) for k in ("a", "b"))


def test_multi_tensor_ops_equal_their_loops() -> None:
    g = torch.Generator().manual_seed(0)
    out = {}
    for fast in (True, False):
        targets = [torch.randn(5, 3, generator=g.manual_seed(1)), torch.randn(7, generator=g)]
        sources = [torch.randn(5, 3, generator=g.manual_seed(2)), torch.randn(7, generator=g)]
        compat.foreach_lerp_(targets, sources, 0.3, fast=fast)
        norms = compat.foreach_norm(targets, fast=fast)
        compat.foreach_mul_(targets, torch.tensor(0.5), fast=fast)
        out[fast] = [*targets, *norms]
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_private_key_filter_is_switched_off_only_where_it_exists() -> None:
    class Collector:
        _exclude_private_keys = True

    collector = Collector()
    assert compat.skip_private_key_filter(collector) and collector._exclude_private_keys is False
    assert not compat.skip_private_key_filter(object())  # no such switch: left filtering


def _rows(n: int) -> TensorDict:
    t = torch.arange(n)
    return TensorDict(
        {
            "i": t,
            "step_count": (t % 10).unsqueeze(-1),
            TRAJ_KEY: t // 10,
            "next": {"done": (t % 10 == 9)[:, None]},
        },
        [n],
    )


@pytest.mark.parametrize("interleaved", [False, True])
def test_without_torchrls_internals_the_replay_samples_with_its_slice_sampler(
    interleaved, monkeypatch
) -> None:
    """The slice samplers' fallback is TorchRL's ``SliceSampler``: the same slices for the same draws."""
    cfg = ReplayConfig(capacity=200, batch_size=12, slice_len=3, device="cpu")
    samples = {}
    for fast in (True, False):
        monkeypatch.setattr(replay_module, "FAST_SLICES", fast)
        replay = make_replay_buffer(cfg, interleaved=interleaved)
        assert (type(replay.sampler) is SliceSampler) is not fast
        replay.extend(_rows(150))
        torch.manual_seed(3)
        samples[fast] = torch.stack([replay.sample()["i"] for _ in range(5)])
    assert torch.equal(samples[True], samples[False])


def test_the_storage_without_direct_copies_holds_and_returns_the_same_rows(monkeypatch) -> None:
    cfg = ReplayConfig(capacity=64, batch_size=16, device="cpu")
    out = {}
    for direct in (True, False):
        replay = make_replay_buffer(cfg)
        monkeypatch.setattr(type(replay.storage), "direct", direct)
        for start in range(0, 100, 20):
            replay.extend(TensorDict({"x": torch.arange(start, start + 20.0)[:, None]}, [20]))
        torch.manual_seed(0)
        out[direct] = (replay.storage[: len(replay)]["x"].clone(), replay.sample()["x"])
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))


def test_direct_optimizer_steps_without_private_kernels_give_the_same_bits() -> None:
    class Progress:
        def increment_ready(self) -> None: ...

        def increment_completed(self) -> None: ...

    params = {}
    for fast in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Linear(4, 3)
        step = CountedStep(torch.optim.Adam(net.parameters(), lr=1e-2, fused=True), Progress(), fast=fast)
        for _ in range(3):
            step.zero_grad(set_to_none=False)
            net(torch.randn(8, 4)).pow(2).mean().backward()
            step.step()
        params[fast] = [p.detach().clone() for p in net.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(params[True], params[False]))


def test_without_the_interpreters_exit_steps_a_command_exits_through_sys_exit(monkeypatch) -> None:
    monkeypatch.setattr(process, "FAST_EXIT", False)
    monkeypatch.setattr(process.os, "_exit", lambda code: pytest.fail("os._exit without the exit steps"))
    with pytest.raises(SystemExit) as exit_info:
        process.exit_process(3)
    assert exit_info.value.code == 3 and sys.stdout is not None
