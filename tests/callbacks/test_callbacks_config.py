"""conf/callbacks/: one file per callback, every argument present and commented, presets in order."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.utils import instantiate

import callbacks

CONF = Path(__file__).resolve().parents[2] / "conf"
PRESETS = {"default", "fast"}
SINGLE = sorted(p.stem for p in (CONF / "callbacks").glob("*.yaml") if p.stem not in PRESETS)

# A primary config holding only the callbacks group, so these tests do not depend on the other groups.
ConfigStore.instance().store(name="_callbacks_only", node={"defaults": [{"callbacks": "default"}, "_self_"]})


def compose_callbacks(selection: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="_callbacks_only", overrides=[f"callbacks={selection}"]).callbacks


#: The callbacks of rl_lightning (not generic: they know the RL data path or an env) with config files.
RL_CALLBACKS = {"rl_lightning.training.hockey_curriculum.HockeyCurriculum"}


def test_every_callback_has_a_config_file() -> None:
    targets = {compose_callbacks(name)[name]["_target_"] for name in SINGLE}
    assert targets == {f"callbacks.{cls}" for cls in callbacks.__all__} | RL_CALLBACKS


@pytest.mark.parametrize("name", SINGLE)
def test_config_file_instantiates_with_every_argument_commented(name: str) -> None:
    node = compose_callbacks(name)
    assert list(node) == [name], "one top-level key per file, named like the file"
    callback = instantiate(node[name], _convert_="all")
    module, _, class_name = node[name]["_target_"].rpartition(".")
    cls = getattr(importlib.import_module(module), class_name)
    assert isinstance(callback, cls)
    arguments = set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert set(node[name]) - {"_target_"} == arguments, "every constructor argument, nothing else"
    lines = (CONF / "callbacks" / f"{name}.yaml").read_text().splitlines()
    for argument in arguments:
        line = next(line for line in lines if line.strip().startswith(f"{argument}:"))
        assert "#" in line, f"{name}.yaml: `{argument}` needs a comment saying what it does"


def test_default_preset() -> None:
    default = ["throughput", "cuda_cache", "fused_optimizer", "direct_steps"]
    assert list(compose_callbacks("default")) == default


def test_fast_preset_order() -> None:
    order = list(compose_callbacks("fast"))
    assert order == [
        "non_blocking",
        "tf32",
        "fused_optimizer",
        "direct_steps",
        "compile",
        "cuda_graphs",
        "gpu_monitor",
        "throughput",
        "cuda_cache",
    ]
    # CudaGraphs wraps what TorchCompile left in on_fit_start: compile must come first.
    assert order.index("compile") < order.index("cuda_graphs")
