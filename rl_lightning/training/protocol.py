"""The evaluation protocol: which episodes choose a checkpoint and which report a figure.

Every episode an env plays is fixed by its env's seed (the eval envs of one evaluation get ``seed + i``,
each continuing its own generator after the first reset), so the sets of episodes are sets of seeds:

- **training**: the training envs of rank ``r`` play from ``seed + r * stride``; a resumed run reseeds them
  ``frames`` further on, so over a run they span ``total_frames`` seeds and the envs beyond.
- **validation** (``eval.seed``): every in-training evaluation replays the same episodes, so that the
  curve's points compare; the best checkpoint (``best.ckpt``), thresholds' "first reached at" and
  hyperparameter choices are made on them. A figure on them is a validation figure, optimistic for the
  checkpoint it picked.
- **test** (``eval.test_seed``): held-out episodes, never played during training or selection. Every
  reported final figure comes from them (``evaluate``'s default; at least 100 episodes or 200 games).

:func:`check_disjoint` refuses a configuration whose test seeds meet the validation or training seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SPLITS", "SeedSets", "check_disjoint", "eval_envs", "seed_range"]

#: The evaluation sets a figure can come from.
SPLITS = ("validation", "test")


def eval_envs(eval_num_envs: int, episodes: int) -> int:
    """How many eval envs play ``episodes`` episodes side by side (as :func:`evaluate_policy` plays them)."""
    return min(eval_num_envs, episodes)


def seed_range(base: int, count: int) -> range:
    """The seeds of ``count`` envs seeded from ``base`` (env ``i`` gets ``base + i``)."""
    return range(base, base + count)


def _meet(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


@dataclass(frozen=True)
class SeedSets:
    """The seeds of one run's training envs (one range per rank) and of its two evaluation sets."""

    training: tuple[range, ...]
    validation: range
    test: range

    @classmethod
    def of_run(
        cls,
        seed: int,
        total_frames: int,
        train_envs: int,
        ranks: int,
        rank_stride: int,
        validation_seed: int,
        test_seed: int,
        eval_envs: int,
    ) -> SeedSets:
        """The seed sets of a run: ``train_envs`` envs a rank (workers included), ``eval_envs`` eval envs."""
        training = tuple(seed_range(seed + r * rank_stride, total_frames + train_envs) for r in range(ranks))
        return cls(training, seed_range(validation_seed, eval_envs), seed_range(test_seed, eval_envs))


def check_disjoint(sets: SeedSets) -> None:
    """Raises ``ValueError`` (one line that says what to change) when the test seeds meet the others."""
    t = sets.test
    if _meet(t, sets.validation):
        raise ValueError(
            f"eval.test_seed={t.start} meets the validation seeds {sets.validation.start}-"
            f"{sets.validation.stop - 1} (eval.seed): choose an eval.test_seed at least "
            f"{sets.validation.stop} or below {sets.validation.start - len(t) + 1}."
        )
    for r, training in enumerate(sets.training):
        if _meet(t, training):
            raise ValueError(
                f"eval.test_seed={t.start} meets rank {r}'s training env seeds {training.start}-"
                f"{training.stop - 1}: choose an eval.test_seed of at least {training.stop} (the default "
                "1000000000 is above every run under a billion frames)."
            )
