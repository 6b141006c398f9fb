"""The state of a gymnasium env as plain values, so that a resumed run continues its episodes exactly.

A checkpoint loads with ``torch.load(weights_only=True)``: it holds tensors, numbers, strings, lists, tuples
and dicts, never a pickled object. :func:`env_state` reads what an env's next steps draw from (its physics
state, the episode's step count, its random generators) into such values and :func:`load_env_state` writes
them back into a fresh env of the same config; both walk the wrapper chain. Which envs resume exactly:

- gymnasium's classic control (CartPole, Pendulum, Acrobot, MountainCar and its continuous version): the
  env's ``state`` (and the few attributes its step reads), its ``np_random`` and ``TimeLimit``'s count;
- MinAtar: the game object's attributes and the sticky-action generator it shares with the game;
- Atari: the emulator's state through the ALE's ``cloneState(include_rng=True)`` (the sticky actions'
  generator included), the frame stack and :class:`~rl_lightning.envs.images.AtariFrames`' last screens;
- any env or wrapper whose class defines ``get_env_state()`` and ``set_env_state(state)`` returning and
  taking plain values (the hockey and trading envs do; their Box2D contact cache is not in it, see the docs).

Anything else (Box2D envs such as LunarLander, a wrapper this module does not know) has no saved state:
:func:`env_state` returns ``None`` and a resumed run starts fresh episodes on its envs, seeded from the
frame count (``docs/getting-started.md``, "Exact resume").
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control import (
    AcrobotEnv,
    CartPoleEnv,
    Continuous_MountainCarEnv,
    MountainCarEnv,
    PendulumEnv,
)
from gymnasium.wrappers import FrameStackObservation, OrderEnforcing, PassiveEnvChecker, ReshapeObservation

from rl_lightning.compat import elapsed_steps, set_elapsed_steps

__all__ = ["env_state", "from_plain", "load_env_state", "to_plain"]

#: The attributes of gymnasium's classic-control envs that their ``step`` reads and writes.
CLASSIC_CONTROL: dict[type, tuple[str, ...]] = {
    CartPoleEnv: ("state", "steps_beyond_terminated"),
    PendulumEnv: ("state", "last_u"),
    AcrobotEnv: ("state",),
    MountainCarEnv: ("state",),
    Continuous_MountainCarEnv: ("state",),
}
#: Wrappers that keep nothing between steps (a frame stack and a time limit keep state, handled below).
STATELESS_WRAPPERS: tuple[type, ...] = (OrderEnforcing, PassiveEnvChecker, ReshapeObservation)


class NotSavable(TypeError):
    """A value that has no plain form (an object of a class this module does not know)."""


def to_plain(value: Any) -> Any:
    """``value`` as values ``torch.load(weights_only=True)`` reads back, each tagged with its Python type so
    that :func:`from_plain` restores that type (a NumPy ``float32`` scalar computes differently from a
    Python float).

    Raises:
        NotSavable: a value of another type.
    """
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise NotSavable(f"an object array of shape {value.shape}")
        return {"ndarray": torch.from_numpy(value.copy())}
    if isinstance(value, np.generic):
        return {"scalar": torch.from_numpy(np.asarray(value).copy())}
    if isinstance(value, np.random.RandomState):
        return {"random_state": to_plain(value.get_state())}
    if isinstance(value, np.random.Generator):
        return {"generator": value.bit_generator.state}
    if isinstance(value, deque):
        return {"deque": [to_plain(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, list | tuple):
        return {type(value).__name__: [to_plain(v) for v in value]}
    if isinstance(value, dict) and all(type(k) is str for k in value):
        return {"dict": {k: to_plain(v) for k, v in value.items()}}
    raise NotSavable(f"a {type(value).__name__}")


def from_plain(plain: Any, current: Any = None) -> Any:
    """The value :func:`to_plain` made ``plain`` of. A generator is set in place into ``current`` when that
    is one of the same kind (a generator shared by several objects stays shared)."""
    if not isinstance(plain, dict):
        return plain
    ((kind, body),) = ((k, v) for k, v in plain.items() if k != "maxlen")
    if kind == "ndarray":
        return body.numpy().copy()
    if kind == "scalar":
        return body.numpy()[()]
    if kind == "random_state":
        rng = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        rng.set_state(from_plain(body))
        return rng
    if kind == "generator":
        if (
            isinstance(current, np.random.Generator)
            and current.bit_generator.state["bit_generator"] == (body["bit_generator"])
        ):
            current.bit_generator.state = body
            return current
        rng = np.random.Generator(getattr(np.random, body["bit_generator"])())
        rng.bit_generator.state = body
        return rng
    if kind == "deque":
        return deque((from_plain(v) for v in body), maxlen=plain["maxlen"])
    if kind in ("list", "tuple"):
        items = [from_plain(v) for v in body]
        return items if kind == "list" else tuple(items)
    return {k: from_plain(v) for k, v in body.items()}


def _attributes(obj: Any, names: Any) -> dict[str, Any]:
    return {name: to_plain(getattr(obj, name)) for name in names}


def _set_attributes(obj: Any, state: dict[str, Any]) -> None:
    for name, plain in state.items():
        setattr(obj, name, from_plain(plain, getattr(obj, name, None)))


def _minatar_game(env: gym.Env) -> Any:
    """MinAtar's ``Environment`` behind its gymnasium env (``None`` for any other env)."""
    game = getattr(env, "game", None)
    return game if type(env).__module__ == "minatar.gym" and game is not None else None


def _saves_itself(env: gym.Env) -> bool:
    """Whether ``env``'s own class (a wrapper's, not what it wraps) defines the two methods."""
    return all(callable(getattr(type(env), name, None)) for name in ("get_env_state", "set_env_state"))


def _ale_state(env: gym.Env) -> dict[str, Any]:
    return {"ale": env.ale.cloneState(include_rng=True).serialize(), "np_random": to_plain(env.np_random)}


def _load_ale_state(env: gym.Env, state: dict[str, Any]) -> None:
    from ale_py import ALEState

    env.ale.restoreState(ALEState(state["ale"]))
    env.np_random = from_plain(state["np_random"], env.np_random)


def _base_state(env: gym.Env) -> dict[str, Any] | None:
    if _saves_itself(env):
        return {"own": env.get_env_state()}
    if type(env).__module__ == "ale_py.env":  # the emulator, with the sticky actions' generator
        return _ale_state(env)
    if type(env) in CLASSIC_CONTROL:
        attributes = _attributes(env, CLASSIC_CONTROL[type(env)])
        return {"attributes": attributes, "np_random": to_plain(env.np_random)}
    game = _minatar_game(env)
    if game is not None:  # the sticky-action generator is the game's own (one object, set in place)
        return {
            "environment": _attributes(game, ("random", "last_action")),
            "game": _attributes(game.env, vars(game.env)),
        }
    return None


def _load_base_state(env: gym.Env, state: dict[str, Any]) -> None:
    if "own" in state:
        env.set_env_state(state["own"])
    elif "ale" in state:
        _load_ale_state(env, state)
    elif "attributes" in state:
        _set_attributes(env, state["attributes"])
        env.np_random = from_plain(state["np_random"], env.np_random)
    else:
        game = _minatar_game(env)
        _set_attributes(game, state["environment"])
        _set_attributes(game.env, state["game"])


def _layers(env: gym.Env) -> list[gym.Env]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _wrapper_state(wrapper: gym.Wrapper) -> Any:
    """A wrapper's state (``{}``: none to keep); raises :class:`NotSavable` for an unknown wrapper."""
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        steps = elapsed_steps(wrapper)
        if steps is None:
            raise NotSavable("a TimeLimit whose step count cannot be read")
        return {"elapsed_steps": steps}
    if _saves_itself(wrapper):
        return {"own": wrapper.get_env_state()}
    if isinstance(wrapper, FrameStackObservation):
        return {"obs_queue": to_plain(wrapper.obs_queue)}
    if isinstance(wrapper, STATELESS_WRAPPERS) or getattr(wrapper, "stateless", False):
        return {}
    raise NotSavable(f"the wrapper {type(wrapper).__name__}")


def env_state(env: gym.Env) -> dict[str, Any] | None:
    """The state of ``env`` and its wrappers as plain values; ``None`` when some part has none that this
    module can read (the env then starts fresh episodes on a resume)."""
    layers = _layers(env)
    try:
        wrappers = [_wrapper_state(w) for w in layers[:-1]]
        base = _base_state(layers[-1])
    except NotSavable:
        return None
    if base is None:
        return None
    return {"wrappers": wrappers, "env": base, "kind": type(layers[-1]).__name__}


def load_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Puts what :func:`env_state` read back into ``env`` (an env made from the same config).

    Raises:
        ValueError: ``state`` is another env's.
    """
    layers = _layers(env)
    if state["kind"] != type(layers[-1]).__name__ or len(state["wrappers"]) != len(layers) - 1:
        raise ValueError(f"the saved env state is a {state['kind']}'s, not a {type(layers[-1]).__name__}'s.")
    for wrapper, saved in zip(layers[:-1], state["wrappers"]):
        if "own" in saved:
            wrapper.set_env_state(saved["own"])
        elif "elapsed_steps" in saved:
            set_elapsed_steps(wrapper, saved["elapsed_steps"])
        elif "obs_queue" in saved:
            wrapper.obs_queue = from_plain(saved["obs_queue"])
    _load_base_state(layers[-1], state["env"])
