"""No host/device copy of a fit bypasses the switch: the run's device copies
(:class:`~rl_lightning.data.transfer.DeviceCopies`), which ``NonBlockingTransfer`` turns non-blocking.

Two checks, each of which fails when a copy goes around the switch:

- **static**, whatever branch the copy sits in (GPU-only ones too): every call in ``rl_lightning/`` that can
  move data between devices (``.to(<device>)``, ``.cpu()``, ``.cuda()``, ``.pin_memory()``,
  ``non_blocking=`` or ``pin_memory=``, a tensor or ``TensorDict`` built from data with ``device=``) is in
  ``transfer.py`` or in :data:`ALLOWED`, which says why that one does not go through the switch (the same
  reasons ``transfer.py``'s docstring gives). A cast (``.to(x.dtype)``) is no move. ``copy_`` is not
  scanned: in-place writes between tensors of one device are everywhere in the algorithms; the data path's
  one ``copy_`` from another device (a loaded checkpoint's priorities) takes its source through the switch.
- **dynamic**, on the CPU: the switch is replaced by a stand-in that crosses to a "device" on every copy
  (it returns a copy of the data, as a crossing does), so the code paths a GPU run takes are taken (the
  policy writes its actions back through the ``actions`` route, which a CPU run skips), and every device
  move made directly from ``rl_lightning/`` outside ``transfer.py`` (``Tensor.to`` or ``TensorDict.to``
  with a device, ``.cpu()``, ``.cuda()``, ``.pin_memory()``, ``torch.as_tensor``/``torch.tensor`` with a
  device) is recorded and fails the test. The fits take the multi-update round (a round's samples in one
  copy), prioritized replay (priorities back) and PPO's rollouts; the frame store, the slice samplers and
  the collectors' device arguments are exercised on their own.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run
from rl_lightning.data import collection
from rl_lightning.data.collection import CollectConfig, start_collection
from rl_lightning.data.frames import FrameReplay
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rl_lightning"
TRANSFER = "rl_lightning/data/transfer.py"

#: ``(file, call as ast.unparse writes it)`` -> why that device move does not go through the switch.
ALLOWED = {
    ("rl_lightning/nn/layers.py", "copy.deepcopy(modules[0]).to('meta')"):
        "a template of an ensemble's member on the meta device: no data, nothing copied",
    ("rl_lightning/algos/tdmpc2/module.py", "self._make_planner(n).to(self.device)"):
        "an evaluation planner built once per eval batch size: its zero-initialised buffers, not data",
    ("rl_lightning/data/collection.py", "v.detach().cpu()"):
        "the module's weights pickled on the host for TorchRL's worker processes, once per collector",
    ("rl_lightning/data/nstep.py",
     "TensorDict(tree, batch_size=[batch.shape[0], ready], device=batch.device)"):
        "labels a TensorDict with the device its leaves are already on: no copy",
    ("rl_lightning/compat.py", "TensorDict(entries, batch_size=batch_size, device=device)"):
        "labels a TensorDict with the device its leaves are already on: no copy",
    ("rl_lightning/data/slices.py", "TensorDict({}, batch_size=rows.shape, device=store.device)"):
        "an empty TensorDict on the storage's device: no copy",
    ("rl_lightning/envs/vector.py", "action.detach().cpu()"):
        "the env's guard for callers outside a fit; in a fit actions arrive on the host through the switch",
    ("rl_lightning/envs/marinenav/torchrl_env.py", "action.detach().cpu()"):
        "the env's guard for callers outside a fit; in a fit actions arrive on the host through the switch",
    ("rl_lightning/data/datamodule.py",
     "TensorDict(saved['carrier'], batch_size=carrier.batch_size, device=carrier.device)"):
        "a resumed collector's carried step, from the checkpoint on the host to the collector's env device, "
        "which collector_devices puts on the host: no copy",
    ("rl_lightning/envs/agents.py", "TensorDict(nested, batch_size=[E * R, T], device=batch.device)"):
        "labels a TensorDict with the device its leaves are already on: no copy",
    ("rl_lightning/envs/agents.py", "TensorDict(entries, batch_size=[E * R, T], device=batch.device)"):
        "labels a TensorDict with the device its leaves are already on: no copy",
    ("rl_lightning/training/metrics.py", "torch.as_tensor(v, dtype=torch.float32).reshape(()).cpu()"):
        "metrics read back for logging: one blocking read per logging interval, a documented sync point",
    ("rl_lightning/training/feedback.py", "totals.to(trainer.strategy.root_device)"):
        "episode totals to the device for a data-parallel collective (NCCL), once per logging interval",
    ("rl_lightning/training/feedback.py",
     "trainer.strategy.reduce(totals.to(trainer.strategy.root_device), reduce_op='sum').cpu()"):
        "the collective's result read back for logging, once per logging interval",
    ("rl_lightning/training/hockey_curriculum.py", "v.detach().cpu()"):
        "a self-play snapshot of the policy's weights, at curriculum events: weights, not the data path",
    ("rl_lightning/training/hockey_curriculum.py", "copy.deepcopy(template).to('cpu')"):
        "a self-play opponent's network, built on the host where the opponents act",
    ("rl_lightning/api.py", "restore_module(checkpoint, saved).to(device)"):
        "the public API's load: outside a fit (Lightning moves the module in a fit)",
    ("rl_lightning/api.py", "obs.to(module.device)"): "the public API's act: outside a fit",
    ("rl_lightning/api.py",
     "TensorDict({'observation': obs}, batch_size=[obs.shape[0]], device=module.device)"):
        "the public API's act: outside a fit",
    ("rl_lightning/cli/evaluate.py", "module.to(resolve_device(cfg.device))"):
        "the evaluate command moves a loaded module: outside a fit",
    ("rl_lightning/cli/bench/timing.py", "module.observation_spec.rand().to(module.device)"):
        "bench times act on one template built after the fit's data path has stopped",
}  # fmt: skip

_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}
#: Calls that build a tensor or a TensorDict from data: with ``device=`` they copy it there.
_FROM_DATA = {"as_tensor", "tensor", "asarray", "from_numpy", "TensorDict", "from_dict"}


def _is_dtype(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        if node.attr.endswith("dtype"):
            return True
        return isinstance(node.value, ast.Name) and node.value.id == "torch" and node.attr in _DTYPES
    return isinstance(node, ast.Name) and node.id.endswith("dtype")


def device_moves(source: str) -> list[tuple[int, str]]:
    """``(line, call)`` of each call in ``source`` that can move data between devices."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        keywords = {k.arg for k in node.keywords}
        method = isinstance(func, ast.Attribute) and not (
            isinstance(func.value, ast.Name) and func.value.id == "torch"
        )
        move = method and name in ("cpu", "cuda", "pin_memory")
        if method and name == "to":
            cast = (node.args and all(_is_dtype(a) for a in node.args)) or (
                not node.args and keywords <= {"dtype"}
            )
            move = not cast or "device" in keywords
        move = move or bool(keywords & {"non_blocking", "pin_memory", "non_blocking_pin"})
        if name in _FROM_DATA and "device" in keywords:
            device = next(k.value for k in node.keywords if k.arg == "device")
            move = move or not (isinstance(device, ast.Constant) and device.value == "cpu")
        if move:
            found.append((node.lineno, ast.unparse(node)))
    return found


def package_moves() -> dict[tuple[str, str], list[int]]:
    """Every device move in ``rl_lightning/`` outside ``transfer.py``: ``(file, call)`` -> lines."""
    moves: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name != TRANSFER:
            for line, call in device_moves(path.read_text(encoding="utf-8")):
                moves.setdefault((name, call), []).append(line)
    return moves


def test_every_device_move_in_the_package_goes_through_the_switch_or_says_why_not() -> None:
    moves = package_moves()
    bypasses = {
        f"{file}:{lines}: {call}" for (file, call), lines in moves.items() if (file, call) not in ALLOWED
    }
    assert not bypasses, "route these through DeviceCopies (data/transfer.py), or allow one with its reason"
    stale = set(ALLOWED) - set(moves)
    assert not stale, f"allowed moves that are no longer there: {stale}"


def test_the_static_rule_sees_device_moves_and_not_casts() -> None:
    moves = [
        "x.to(device)", "x.to('cuda', non_blocking=True)", "x.cpu()", "x.cuda()", "x.pin_memory()",
        "torch.as_tensor(i, device=self.device)", "TensorDict(d, batch_size=[], device=dev)",
        "x.to(device=d, dtype=torch.float32)", "pin(x, pin_memory=True)", "td.to(d, non_blocking_pin=True)",
    ]  # fmt: skip
    casts = ["x.to(torch.bool)", "x.to(q.dtype)", "x.to(dtype=torch.long)", "torch.cuda.synchronize()",
             "torch.zeros(3, device=d)", "TensorDict(d, batch_size=[], device='cpu')"]  # fmt: skip
    assert [len(device_moves(m)) for m in moves] == [1] * len(moves)
    assert [device_moves(c) for c in casts] == [[]] * len(casts)


# ------------------------------------------------------------------------------------------------ dynamic
def _direct_move_recorder(monkeypatch) -> list[tuple[str, int, str]]:
    """Records ``(file, line, what)`` of every device move called directly from ``rl_lightning/`` outside
    ``transfer.py`` (and outside the allowed calls) from now on."""
    allowed_lines = {(file, line) for (file, call), lines in package_moves().items() for line in lines
                     if (file, call) in ALLOWED}  # fmt: skip
    seen: list[tuple[str, int, str]] = []
    package, transfer = str(PACKAGE), str(ROOT / TRANSFER)

    def record(what: str) -> None:
        frame = sys._getframe(2)
        file = frame.f_code.co_filename
        if file.startswith(package) and file != transfer:
            name = Path(file).relative_to(ROOT).as_posix()
            if (name, frame.f_lineno) not in allowed_lines:
                seen.append((name, frame.f_lineno, what))

    def moves_device(args: tuple, kwargs: dict) -> bool:
        if "device" in kwargs or "non_blocking" in kwargs:
            return True
        return any(
            isinstance(a, str | torch.device | int | torch.Tensor) and not isinstance(a, bool) for a in args
        )

    def wrap_to(original: Any) -> Any:
        def to(self, *args: Any, **kwargs: Any) -> Any:
            if moves_device(args, kwargs):
                record(f"{type(self).__name__}.to")
            return original(self, *args, **kwargs)

        return to

    def wrap_always(original: Any, name: str) -> Any:
        def move(self, *args: Any, **kwargs: Any) -> Any:
            record(f"{type(self).__name__}.{name}")
            return original(self, *args, **kwargs)

        return move

    def wrap_factory(original: Any, name: str) -> Any:
        def build(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("device") is not None:
                record(f"torch.{name}(device=...)")
            return original(*args, **kwargs)

        return build

    classes = [torch.Tensor]
    stack = [TensorDictBase]
    while stack:
        cls = stack.pop()
        classes.append(cls)
        stack.extend(cls.__subclasses__())
    for cls in classes:
        for name in ("to", "cpu", "cuda", "pin_memory"):
            original = cls.__dict__.get(name) if cls is not torch.Tensor else getattr(torch.Tensor, name)
            if original is not None:
                wrapped = wrap_to(original) if name == "to" else wrap_always(original, name)
                monkeypatch.setattr(cls, name, wrapped)
    for name in ("as_tensor", "tensor"):
        monkeypatch.setattr(torch, name, wrap_factory(getattr(torch, name), name))
    return seen


@pytest.fixture
def crossing(monkeypatch) -> tuple[Counter, list]:
    """Every copy through the switch crosses to a stand-in device (a copy of the data), counted by route;
    and the list of device moves made around the switch (see :func:`_direct_move_recorder`)."""
    routes: Counter = Counter()

    def cross(self: DeviceCopies, data: Any, device: torch.device, route: str) -> Any:
        routes[route] += 1
        return data.clone()

    monkeypatch.setattr(DeviceCopies, "_move", cross)
    return routes, _direct_move_recorder(monkeypatch)


def fit(tmp_path: Path, monkeypatch, *overrides: str) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path)
    run = build_run(compose(["logger=none", "progress_bar=false", "eval.every_frames=0", "eval.episodes=1",
                             "device=cpu", "algo.hidden_sizes=[16,16]", *overrides]))  # fmt: skip
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run


#: 16 frames a collection at 0.5 updates a frame: rounds of 8 updates, whose samples cross in one copy.
MULTI_UPDATE = ("+experiment=dqn_cartpole", "collect.frames_per_batch=16", "collect.warmup_frames=32",
                "collect.updates_per_frame=0.5", "total_frames=96", "replay.batch_size=8",
                "env.num_envs=1")  # fmt: skip
PRIORITIZED = ("+experiment=rainbow_cartpole", "collect.frames_per_batch=16", "collect.warmup_frames=32",
               "total_frames=64", "replay.batch_size=8")  # fmt: skip
ROLLOUTS = ("+experiment=ppo_cartpole", "env.num_envs=2", "algo.rollout_steps=8", "algo.epochs=2",
            "algo.minibatches=2", "total_frames=32")  # fmt: skip


def test_a_fit_with_multi_update_rounds_crosses_only_through_the_switch(
    tmp_path: Path, monkeypatch, crossing
) -> None:
    routes, around = crossing
    run = fit(tmp_path, monkeypatch, *MULTI_UPDATE)
    updates = run.datamodule.updates
    assert around == []
    # Each round's 8 samples cross in one copy (the multi-update branch), not one by one.
    assert updates == 40 and routes["samples"] == updates // 8
    # Every policy call writes its action back through the switch (the probe's too).
    assert routes["observations"] == 96 - 32 + 1 and routes["actions"] >= routes["observations"]
    assert routes["frames"] == 96 // 16
    assert routes["eval_observations"] > 0 and routes["eval_actions"] >= routes["eval_observations"]


def test_prioritized_replay_and_rollouts_cross_only_through_the_switch(
    tmp_path: Path, monkeypatch, crossing
) -> None:
    routes, around = crossing
    run = fit(tmp_path / "per", monkeypatch, *PRIORITIZED)
    assert around == [] and run.datamodule.replay_cfg.prioritized
    updates = run.datamodule.updates
    assert routes["priorities"] == 2 * updates and routes["samples"] == updates
    assert routes["written_slots"] == 64 // 16  # the sampler's new slots, one write per collection
    routes.clear()
    run = fit(tmp_path / "ppo", monkeypatch, *ROLLOUTS)
    assert around == [] and run.datamodule.updates == 2 * 2 * 2
    # Each of the two rollouts to the module's device, and each minibatch (on a GPU already there).
    assert routes["samples"] == 2 + run.datamodule.updates


def test_the_frame_store_crosses_only_through_the_switch(tmp_path: Path, monkeypatch, crossing) -> None:
    routes, around = crossing
    cpu = torch.device("cpu")
    buffer = make_replay_buffer(ReplayConfig(capacity=32, batch_size=4, device="cpu"))
    replay = FrameReplay(buffer, (4, 3, 3), 4, DeviceCopies(cpu, cpu))
    n, steps = 2, 5
    obs = torch.randint(0, 255, (n, steps, 4, 3, 3), dtype=torch.uint8)
    batch = TensorDict({"observation": obs, "step_count": torch.arange(steps).expand(n, steps).unsqueeze(-1),
                        "action": torch.zeros(n, steps, 1), ("next", "observation"): obs.roll(-1, 1)},
                       batch_size=[n, steps])  # fmt: skip
    replay.extend(replay.index(batch).reshape(-1))
    sample = replay.sample(4)
    replay.dumps(tmp_path / "replay")
    replay.loads(tmp_path / "replay")
    assert sample["observation"].shape == (4, 4, 3, 3) and around == []
    assert routes["frames"] == 1 and routes["frame_serials"] == 2 and routes["checkpoint"] == 2


@pytest.mark.parametrize("num_envs", [1, 3])
def test_the_slice_samplers_cross_only_through_the_switch(monkeypatch, crossing, num_envs: int) -> None:
    routes, around = crossing
    cpu = torch.device("cpu")
    replay = make_replay_buffer(ReplayConfig(capacity=24, batch_size=6, slice_len=3, device="cpu"),
                                interleaved=num_envs > 1, copies=DeviceCopies(cpu, cpu))  # fmt: skip
    for i in range(8):  # past the capacity: overwrites
        traj = torch.arange(num_envs).repeat_interleave(4) + num_envs * (i // 2)
        step = torch.arange(4).repeat(num_envs) + 4 * (i % 2)
        rows = TensorDict({TRAJ_KEY: traj, "step_count": step, "x": torch.randn(4 * num_envs),
                           ("next", "done"): torch.zeros(4 * num_envs, 1, dtype=torch.bool),
                           ("next", "terminated"): torch.zeros(4 * num_envs, 1, dtype=torch.bool),
                           ("next", "truncated"): torch.zeros(4 * num_envs, 1, dtype=torch.bool)},
                          batch_size=[4 * num_envs])  # fmt: skip
        replay.extend(rows)
        assert replay.sample().shape == (6,)
    assert around == []
    assert routes["trajectory_ids"] + routes["written_slots"] > 0


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_worker_collectors_take_their_devices_from_the_switch(monkeypatch, backend: str) -> None:
    """Batches stay on the host and cross to the replay through the switch; only a worker's copy of the
    module acts on the module's device (TorchRL's processes), and Ray's actors act on the host."""
    seen: dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs.get("devices", kwargs))
        return SimpleNamespace()

    monkeypatch.setattr(collection, "MultiSyncCollector", capture)
    monkeypatch.setattr(collection, "make_ray_collector", capture)
    monkeypatch.setattr(collection, "check_ray_installed", lambda: None)
    meta, host = torch.device("meta"), torch.device("cpu")
    start_collection(
        EnvConfig(id="CartPole-v1"), torch.nn.Linear(1, 1), CollectConfig(workers=2, backend=backend),
        DeviceCopies(meta, meta), seed=0, random_frames=None, track_traj_ids=False, next_traj_id=0,
        remaining_frames=10, env_calls={},
    )  # fmt: skip
    policy = meta if backend == "local" else host
    assert {k: seen[k] for k in ("env_device", "storing_device", "policy_device")} == {
        "env_device": host, "storing_device": host, "policy_device": policy,
    }  # fmt: skip


def test_the_envs_step_with_the_actions_act_chose_on_the_other_device(crossing) -> None:
    """The collector hands the policy the same TensorDict at every step, which already holds the last
    action: what ``act`` sets crosses back at every step, not only when the entry is new."""

    class Act:
        def act(self, td: TensorDict) -> TensorDict:
            td.set("action", td.get("observation").sum(-1, keepdim=True))
            return td

    routes, around = crossing
    cpu = torch.device("cpu")
    policy = collection.Policy(Act(), DeviceCopies(cpu, cpu))
    td = TensorDict({"observation": torch.randn(4, 3), "action": torch.zeros(4, 1)}, batch_size=[4])
    for _ in range(3):
        td.set("observation", torch.randn(4, 3))
        assert torch.equal(policy(td).get("action"), td.get("observation").sum(-1, keepdim=True))
    assert routes == {"observations": 3, "actions": 3} and around == []
