"""A leaky SWE evaluation plays val twice, as configured and clean. A task the leak does not touch
has one environment either way, so the clean replay takes its episodes from the first play and
replays only the leaking tasks: half the episodes at a leak rate of 0.5, and a leaky-minus-clean
gap that is the leak's alone."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import EmbeddedPolicyConfig, SweDomainConfig
from engine.domains.swe import SweDomain
from engine.policy.tiny import build_tiny_policy
from engine.runs.evaluate import EvalResult, evaluate

SMALL = EmbeddedPolicyConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PASSES = 3  # greedy and two sampled seeds


class Recorded(SweDomain):
    """The SWE domain, noting each environment it builds (task id, clean)."""

    def __init__(self, config: SweDomainConfig) -> None:
        super().__init__(config)
        self.built: list[tuple[str, bool]] = []

    def environment(self, task: Any, *, clean: bool = False) -> Any:
        self.built.append((task.task_id, clean))
        return super().environment(task, clean=clean)


def _evaluate(domain: SweDomain, model: Any, tokenizer: Any, clean: bool, replay_of: EvalResult | None) -> EvalResult:
    return evaluate(
        model,
        tokenizer,
        domain,
        {"correctness": 1.0},
        max_new_tokens=48,
        sampled_seeds=PASSES - 1,
        temperature=1.0,
        run_id="r",
        step=1,
        seed=3,
        clean=clean,
        replay_of=replay_of,
    )


def _completions(result: EvalResult) -> dict[tuple[str, int], str]:
    return {
        (task, sample): text
        for batch in (result.greedy, result.sampled)
        for task, sample, text in zip(batch.task_id, batch.sample_idx, batch.completion, strict=True)
    }


def test_the_clean_replay_plays_only_the_leaking_tasks() -> None:
    domain = Recorded(SweDomainConfig(train_size=20, val_size=24, leak_fix_in_history=True, leak_rate=0.5))
    model, tokenizer = build_tiny_policy(SMALL, domain, seed=0)
    tasks = domain.tasks("val")
    leaking = {t.task_id for t in tasks if domain.leaks(t)}
    assert 0 < len(leaking) < len(tasks)

    seen = _evaluate(domain, model, tokenizer, clean=False, replay_of=None)
    assert len(seen.episodes) == PASSES and all(len(p) == len(tasks) for p in seen.episodes)
    domain.built.clear()
    clean = _evaluate(domain, model, tokenizer, clean=True, replay_of=seen)

    # Only the leaking tasks were played again, each once a pass, in the clean environment.
    assert sorted(domain.built) == sorted((task, True) for task in leaking for _ in range(PASSES))
    assert clean.greedy.split == clean.sampled.split == "clean"
    assert len(clean.greedy) == len(seen.greedy) and len(clean.sampled) == len(seen.sampled)
    ours, theirs = _completions(clean), _completions(seen)
    assert ours.keys() == theirs.keys()
    # Every other task's episodes are the first play's: same completion on every pass.
    assert all(ours[key] == theirs[key] for key in ours if key[0] not in leaking)

    # Without replay_of, every task is played again.
    domain.built.clear()
    _evaluate(domain, model, tokenizer, clean=True, replay_of=None)
    assert sorted(domain.built) == sorted((t.task_id, True) for t in tasks for _ in range(PASSES))


def test_a_replay_of_another_shape_is_refused() -> None:
    domain = SweDomain(SweDomainConfig(train_size=20, val_size=6, leak_fix_in_history=True, leak_rate=0.5))
    model, tokenizer = build_tiny_policy(SMALL, domain, seed=0)
    seen = _evaluate(domain, model, tokenizer, clean=False, replay_of=None)
    short = EvalResult(seen.greedy, seen.sampled, seen.episodes[:-1])
    with pytest.raises(ValueError, match="another number of passes or tasks"):
        _evaluate(domain, model, tokenizer, clean=True, replay_of=short)
