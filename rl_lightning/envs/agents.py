"""Many agents, one policy: agents as a batch dimension of an env, rows of one batch for policy and replay.

An env whose vehicles act from their own observations (marine navigation) keeps TorchRL's multi-agent
layout: an ``("agents", ...)`` group of batch ``[E, R]`` under the env's batch ``[E]`` with
``observation``, ``action``, ``("next", "agents", "reward" | "terminated" | "truncated" | "done")`` per agent
and a validity ``mask`` (the agents active at the step's start), which TorchRL's convention lacks: it
assumes a fixed agent count, while here episodes have different numbers of agents and agents leave
mid-episode. Env-level ``done`` and the episode statistics stay at the root.

The policy and the replay see the agents as rows of an ordinary batch: :func:`act_rows` runs one policy
call over all ``E * R`` agents (shared parameters), and :func:`agent_transitions` turns a collected
``[E, T]`` batch into per-agent transitions ``[E * R, T]`` with the standard keys (``observation``,
``action``, ``("next", "reward")``, ...), so an off-policy algorithm trains on them unchanged. The mask
says which rows are transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Composite

__all__ = ["AGENTS", "MASK_KEY", "act_rows", "agent_group", "agent_transitions", "policy_specs"]

#: The group key of the agents (TorchRL's multi-agent convention).
AGENTS = "agents"
#: The per-agent validity entry inside the group: the agent was active when the step began.
MASK_KEY = "mask"
#: The per-agent entries of ``"next"`` that a transition keeps.
_NEXT_KEYS = ("observation", "reward", "terminated", "truncated", "done")


def agent_group(env: Any) -> str | None:
    """The env's agent group (``None`` for an env with one agent per env)."""
    return getattr(env, "agent_group", None)


def policy_specs(env: Any) -> tuple[Composite, Any]:
    """``(observation spec, action spec)`` of one row of the policy's batch, as modules are built from.

    For a plain env: its full observation spec and its action. For an env with an agent group: one agent's
    observation and action with the group's ``[E, R]`` dims flattened into one batch dim, so a module sees
    agents as it sees envs (``observation [N, *shape]``).
    """
    group = agent_group(env)
    if group is None:
        return env.full_observation_spec.clone(), env.full_action_spec["action"].clone()
    obs = env.full_observation_spec[group, "observation"]
    action = env.full_action_spec[group, "action"]
    n = int(torch.Size(obs.shape[:2]).numel())
    obs_row = obs.clone().reshape(n, *obs.shape[2:])
    action_row = action.clone().reshape(n, *action.shape[2:])
    return Composite(observation=obs_row, shape=(n,)), action_row


def act_rows(
    act: Callable[[TensorDictBase], TensorDictBase], td: TensorDictBase, group: str | None
) -> TensorDictBase:
    """Runs ``act`` once on every agent of ``td`` as rows, and writes what it adds back into the group.

    With ``group=None`` this is ``act(td)``. Otherwise ``td[group]`` (``[E, R]``) is viewed as ``[E * R]``
    rows, ``act`` runs on them in one call (inactive agents' zero rows included: shapes stay static), and
    every entry it sets (the action, an algorithm's extra keys) is put back as ``[E, R, ...]``.
    """
    if group is None:
        return act(td)
    agents = td.get(group)
    rows = agents.reshape(-1)
    # Every entry act set, new or not: a collector hands the same TensorDict at every step, which already
    # holds the previous step's action (an entry act did not touch is the same tensor).
    before = {key: rows.get(key) for key in rows.keys(True, True)}
    out = act(rows)
    for key in out.keys(True, True):
        value = out.get(key)
        if before.get(key) is not value:
            agents.set(key, value.reshape(*agents.batch_size, *value.shape[1:]))
    return td


def agent_transitions(batch: TensorDictBase, group: str) -> TensorDict:
    """Per-agent transitions ``[E * R, T]`` of a collected ``[E, T]`` batch, with the standard keys.

    Root entries of the group (``observation``, ``action``, ``mask``, whatever ``act`` wrote) stay at the
    root, the group's ``next`` entries (:data:`_NEXT_KEYS`) go under ``"next"``; each row is one agent
    slot's steps in time order, so n-step windows run along one agent and stop at its own end. ``mask``
    marks the rows that are transitions (the agent was active when the step began).
    """
    agents = batch.get(group)  # [E, T, R]
    nxt = batch.get(("next", group))
    E, T, R = agents.batch_size[:3]

    def by_agent(value: torch.Tensor) -> torch.Tensor:
        return value.transpose(1, 2).reshape(E * R, T, *value.shape[3:])

    entries: dict[str, Any] = {k: by_agent(v) for k, v in agents.items() if isinstance(v, torch.Tensor)}
    nested = {k: by_agent(nxt.get(k)) for k in _NEXT_KEYS if k in nxt.keys()}
    entries["next"] = TensorDict(nested, batch_size=[E * R, T], device=batch.device)
    return TensorDict(entries, batch_size=[E * R, T], device=batch.device)
