"""Every private API the project uses has a public fallback that gives the same results.

Each private name of a dependency lives in ``rl_lightning/compat.py`` or ``callbacks/_compat.py``
(``tests/test_private_names.py`` checks it), behind a check that the name exists and the version lies in
the range it was checked on; a release outside it takes the public path. Here each public path runs
against the private one on the same inputs.
"""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.utilities.apply_func import _TransferableDataType
from lightning.pytorch.loggers import WandbLogger
from tensordict import TensorDict
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torchrl.data.replay_buffers.samplers import SliceSampler

from callbacks import _compat as callbacks_compat
from callbacks.direct_steps import FAST_STEPS, CountedStep, DirectSteps
from rl_lightning import compat
from rl_lightning.cli import process
from rl_lightning.data import replay as replay_module
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer
from rl_lightning.data.slices import FAST_SLICES
from rl_lightning.data.storage import DIRECT_STORAGE


def test_this_release_takes_every_fast_path() -> None:
    """The pinned versions have every private symbol: a failure here means a fast path is lost."""
    assert compat.HAS_FAST_TD and compat.HAS_FOREACH and FAST_STEPS and FAST_SLICES and DIRECT_STORAGE
    assert compat.HAS_EXIT_STEPS and compat.HAS_MODULE_MOVE_HOOK and compat.HAS_PLAIN_TRAINING_FLAG
    assert compat.HAS_TRAINER_SLOT and callbacks_compat.HAS_DIRECT_STEPS
    assert all(compat.checked(p) for p in ("torch", "tensordict", "torchrl", "lightning", "mlflow"))


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


def test_a_collectors_carried_step_is_read_and_replaced_where_it_is_kept() -> None:
    """The carried step of a real collector (``_carrier`` on TorchRL 0.14.1) is its envs' current step;
    replacing it is what the collector's next step acts on. Without one nothing is read or changed."""
    import gymnasium as gym
    from torchrl.collectors import Collector
    from torchrl.envs import GymWrapper

    env = GymWrapper(gym.make("CartPole-v1"))
    collector = Collector(env, None, frames_per_batch=2, total_frames=-1)
    carrier = compat.collector_carrier(collector)
    assert carrier is not None and carrier.get("observation").shape == (4,)
    moved = carrier.clone()
    assert compat.set_collector_carrier(collector, moved) and compat.collector_carrier(collector) is moved
    assert compat.collector_carrier(object()) is None and not compat.set_collector_carrier(object(), moved)
    collector.shutdown()


def test_a_time_limits_count_is_read_and_set() -> None:
    import gymnasium as gym

    env = gym.make("CartPole-v1", max_episode_steps=5)
    assert compat.elapsed_steps(env) is None  # before the first reset: no episode to save
    env.reset(seed=0)
    env.step(0)
    assert compat.elapsed_steps(env) == 1
    compat.set_elapsed_steps(env, 4)
    assert env.step(0)[3]  # the fifth step of the episode: truncated
    assert compat.elapsed_steps(object()) is None


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
    monkeypatch.setitem(sys.modules, "torch", torch)  # a command that loaded torch
    monkeypatch.setattr(compat, "HAS_EXIT_STEPS", False)
    monkeypatch.setattr(process.os, "_exit", lambda code: pytest.fail("os._exit without the exit steps"))
    with pytest.raises(SystemExit) as exit_info:
        process.exit_process(3)
    assert exit_info.value.code == 3 and sys.stdout is not None


def test_outside_the_checked_versions_the_public_paths_are_taken(monkeypatch) -> None:
    monkeypatch.setitem(compat.CHECKED, "torchrl", ("0.1", "0.2"))
    compat.checked.cache_clear()
    try:
        assert not compat.checked("torchrl") and compat.checked("torch")

        class Collector:
            _exclude_private_keys = True

        assert not compat.skip_private_key_filter(Collector())
    finally:
        compat.checked.cache_clear()


class _Cached:
    """A module that keeps a list of its parameters until it moves (as ``RLModule`` does)."""

    def on_move(self) -> None:
        self.moves += 1
        self.cache = None


@pytest.mark.parametrize("hook", [compat._PrivateMoveHook, compat._PublicMoveHook])
def test_both_move_hooks_see_every_move_and_cast(hook) -> None:
    class Net(_Cached, hook):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.moves, self.cache = nn.Linear(2, 2), 0, []

    net = Net()
    net.to(torch.float64)
    net.float()
    net.cpu()
    net.half()
    assert net.moves == 4 and net.cache is None and net.lin.weight.dtype is torch.float16


def test_training_flags_set_directly_equal_the_public_attribute() -> None:
    nets = {fast: [nn.Linear(1, 1), nn.Dropout(), nn.Sequential(nn.ReLU())] for fast in (True, False)}
    for fast, modules in nets.items():
        compat.set_training_flags(modules, [False, True, False], fast=fast)
    assert [m.training for m in nets[True]] == [m.training for m in nets[False]] == [False, True, False]
    assert all("training" in vars(m) for m in nets[True])


def test_the_trainer_slot_reads_as_the_public_property() -> None:
    module, bar = pl.LightningModule(), pl.callbacks.TQDMProgressBar()
    for obj in (module, bar):
        assert compat.attached_trainer(obj, fast=True) is None is compat.attached_trainer(obj, fast=False)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False)
    module.trainer, bar._trainer = trainer, trainer
    for obj in (module, bar):
        assert compat.attached_trainer(obj, fast=True) is trainer is compat.attached_trainer(obj, fast=False)


def test_a_samplers_generator_is_the_one_the_replay_buffer_was_given() -> None:
    g = torch.Generator().manual_seed(0)
    replay = make_replay_buffer(ReplayConfig(capacity=8, batch_size=2, device="cpu"))
    replay.set_rng(g)
    assert compat.sampler_generator(replay.sampler) is g
    assert compat.sampler_generator(object()) is None


def test_the_storage_bookkeeping_agrees_with_the_storages_public_view() -> None:
    replay = make_replay_buffer(ReplayConfig(capacity=16, batch_size=4, device="cpu"))
    for n in (5, 20):
        replay.extend(TensorDict({"x": torch.arange(n, dtype=torch.float32)[:, None]}, [n]))
        storage = replay.storage
        assert compat.storage_written(storage) == len(storage)
        assert compat.storage_is_full(storage) is (len(storage) == storage.max_size)
        assert torch.equal(compat.storage_table(storage)["x"][: len(storage)], storage[: len(storage)]["x"])


def test_the_replays_key_helper_equals_torchrls() -> None:
    from torchrl._utils import _replace_last as torchrl_replace_last

    from rl_lightning.data.slices import _replace_last

    for key in ("truncated", ("next", "truncated"), ("a", "b", "c")):
        assert _replace_last(key, "done") == torchrl_replace_last(key, "done")


def test_the_atari_frame_skip_reads_the_same_from_the_registration() -> None:
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("ale_py")
    for frameskip in (1, 4):
        env = gym.make("ALE/Pong-v5", frameskip=frameskip)
        try:
            found = {fast: compat.atari_frameskip(env.unwrapped, fast=fast) for fast in (True, False)}
        finally:
            env.close()
        assert found == {True: frameskip, False: frameskip}


def test_a_wandb_loggers_run_is_seen_unstarted_on_both_paths(tmp_path) -> None:
    pytest.importorskip("wandb")
    logger = WandbLogger(save_dir=str(tmp_path), offline=True)
    assert not compat.wandb_run_started(logger, fast=True)
    assert not compat.wandb_run_started(logger, fast=False)


def test_the_mlflow_client_made_anew_reads_the_loggers_store(tmp_path) -> None:
    from rl_lightning.training.mlflow_logger import BufferedMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = BufferedMLFlowLogger(tracking_uri=uri, experiment_name="compat", flush_every_s=0)
    assert compat.mlflow_logger_unstarted(logger)
    experiment_id = logger.experiment_id  # found or made through the fast path
    assert not compat.mlflow_logger_unstarted(logger)
    ours, fresh = (compat.mlflow_logger_client(logger, uri, fast=fast) for fast in (True, False))
    assert ours is not fresh
    assert ours.get_experiment_by_name("compat").experiment_id == experiment_id
    assert fresh.get_experiment_by_name("compat").experiment_id == experiment_id
    logger.finalize()


def test_without_mlflows_schema_functions_the_store_is_left_to_mlflow(tmp_path, monkeypatch) -> None:
    from rl_lightning.training import mlflow_store

    monkeypatch.setattr(compat, "mlflow_schema_tools", lambda: None)
    assert not mlflow_store.prepare_sqlite_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not (tmp_path / "mlflow.db").exists()


def test_the_callbacks_multi_tensor_ops_equal_their_loops() -> None:
    out = {}
    for fast in (True, False):
        tensors = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
        callbacks_compat.foreach_add_(tensors, 2.0, fast=fast)
        out[fast] = [t.clone() for t in tensors]
        callbacks_compat.foreach_zero_(tensors, fast=fast)
        out[fast] += tensors
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))


def test_a_step_hook_is_seen_so_the_public_step_runs() -> None:
    opt = torch.optim.Adam([nn.Parameter(torch.zeros(2))])
    assert not callbacks_compat.has_step_hooks(opt)
    handle = opt.register_step_post_hook(lambda *_: None)
    assert callbacks_compat.has_step_hooks(opt)
    handle.remove()
    handle = register_optimizer_step_pre_hook(lambda *_: None)
    try:
        assert callbacks_compat.has_step_hooks(opt)
    finally:
        handle.remove()


def test_without_lightnings_step_count_direct_steps_keep_lightnings_wrappers(monkeypatch) -> None:
    from callbacks import direct_steps

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization, self.direct_optimizers = False, None

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert callbacks_compat.manual_step_progress(trainer) is not None
    monkeypatch.setattr(direct_steps, "manual_step_progress", lambda trainer: None)
    module, callback = Module(), DirectSteps()
    monkeypatch.setattr(direct_steps, "why_wrappers_needed", lambda *_: None)
    callback.on_fit_start(trainer, module)
    assert module.direct_optimizers is None and callback.direct_fits == 0


def test_transferable_matches_lightnings_private_type() -> None:
    class Movable:
        def to(self, device):
            return self

    samples = [
        torch.ones(1),
        TensorDict({}, []),
        nn.Linear(1, 1),
        Movable(),
        {"a": 1},
        3,
        "s",
        [torch.ones(1)],
    ]
    for sample in samples:
        assert isinstance(sample, callbacks_compat.Transferable) is isinstance(sample, _TransferableDataType)


def test_torchs_public_backend_list_is_the_one_dynamo_keeps() -> None:
    assert torch.compiler.list_backends() == torch._dynamo.list_backends()


def test_a_deprecation_that_our_code_causes_is_an_error() -> None:
    """pytest's filters (``pyproject.toml``) turn a deprecation attributed to the project's modules into an
    error, and leave one from elsewhere a warning."""
    code = compile("import warnings\nwarnings.warn('old API', DeprecationWarning)\n", "caller.py", "exec")
    for module in ("rl_lightning.data.fake", "callbacks.fake"):
        with pytest.raises(DeprecationWarning, match="old API"):
            exec(code, {"__name__": module})
    with pytest.warns(DeprecationWarning):
        exec(code, {"__name__": "some_library"})
