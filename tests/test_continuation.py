"""A child that changes nothing but `recipe.steps` continues its parent's training: a lineage trained
in segments is the same training as one long run, and records its steps like any run.

The oracle of "the same training" is one uninterrupted run from the same v0: its final weights and
the prompts of its later steps. A continuation that restarted the optimizer, the data or the RNG
would end elsewhere; one that replayed the data from the start would see the long run's first
prompts again (what a fresh child sees).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.trainer import TRAINER_STATE_NAME
from trl.trainer.utils import RepeatSampler

from engine import faults
from engine.coach.interventions import edit_toml
from engine.config import CONFIG_FILE, WorkspaceConfig, parse_config
from engine.core import Engine, VersionPlan
from engine.domains import make_domain
from engine.policy.pretrained import load_policy, save_policy
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.runs import continuation, worker
from engine.runs.artifacts import EVENTS_FILE, EventLog, read_events
from engine.runs.spec import RunSpec
from engine.store import Store
from engine.workspace import Workspace, template_dir
from tests.conftest import tiny_toml


def sample_config(**changes: Any) -> WorkspaceConfig:
    text = (template_dir("sample") / CONFIG_FILE).read_text()
    return parse_config(edit_toml(text, changes), Path(CONFIG_FILE))


def test_only_a_change_of_steps_or_rate_continues_training() -> None:
    parent = sample_config()
    assert continuation.continues_training(parent, parent)  # the control: no change at all
    assert continuation.continues_training(parent, sample_config(**{"recipe.steps": 37}))
    assert continuation.continues_training(parent, sample_config(**{"recipe.learning_rate": 4e-5}))  # a new rate
    for change in (
        {"recipe.steps": 37, "recipe.temperature": 0.7},  # steps and something else
        {"recipe.seed": 1},
        {"recipe.save_every": 5},
        {"recipe.group_filter.enabled": True},
        {"recipe.rewards.format": 0.2},
        {"domain.train_size": 100},
        {"data.exclude_subsets": ["ops4"]},
        {"eval.sampled_seeds": 3},
        {"compute.max_retries": 2},
    ):
        assert not continuation.continues_training(parent, sample_config(**change)), change


def test_the_kept_checkpoint_is_found_as_transformers_marks_it_whole(tmp_path: Path) -> None:
    assert continuation.TRAINER_STATE == TRAINER_STATE_NAME
    run = tmp_path / "trainer"
    for step, whole in ((4, True), (6, True), (8, False)):  # 8: cut off mid-save
        folder = run / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "optimizer.pt").write_bytes(b"x" * 10)
        if whole:
            (folder / TRAINER_STATE_NAME).write_text("{}")
    model_dir = tmp_path / "models" / "v3"
    model_dir.mkdir(parents=True)
    assert continuation.kept_checkpoint(model_dir) is None
    last = continuation.last_checkpoint(run)
    assert last is not None
    kept = continuation.keep(last, model_dir)
    assert kept == model_dir / continuation.RESUME_DIR / "checkpoint-6" == continuation.kept_checkpoint(model_dir)
    assert continuation.checkpoint_step(kept) == 6
    continuation.keep(run / "checkpoint-4", model_dir)  # again: it replaces the one before
    assert sorted(p.name for p in (model_dir / continuation.RESUME_DIR).iterdir()) == ["checkpoint-4"]
    assert (kept.parent / "checkpoint-4" / "optimizer.pt").read_bytes() == b"x" * 10


def test_the_epoch_sampler_keeps_the_uninterrupted_order_and_finds_it_after_a_resume() -> None:
    data = list(range(20))
    trl = RepeatSampler(data, mini_repeat_count=2, batch_size=4, repeat_count=1, shuffle=True, seed=3)
    orders = [list(trl) for _ in range(4)]  # TRL's own: one generator drawn on, epoch after epoch
    assert len({tuple(o) for o in orders}) == 4
    ours = worker.EpochSampler.like(trl)
    for epoch in range(4):  # an uninterrupted run: transformers sets the epoch before each
        ours.set_epoch(epoch)
        assert list(ours) == orders[epoch]
    resumed = worker.EpochSampler.like(trl)  # a resumed run starts in epoch 2
    for epoch in (2, 3):
        resumed.set_epoch(epoch)
        assert list(resumed) == orders[epoch]


# -- real GRPO ---------------------------------------------------------------------------------------
#: Steps of each segment, and of the long run (2 x K).
K = 2


def train_prompts(store: Store, run_id: str) -> dict[int, list[str]]:
    rows = store.query(
        """SELECT step, list(prompt ORDER BY group_id) FROM rollouts
           WHERE run_id = ? AND split = 'train' AND sample_idx = 0 GROUP BY step ORDER BY step""",
        [run_id],
    )
    return {int(step): list(prompts) for step, prompts in rows}


def weights(path: Path) -> list[torch.Tensor]:
    model, _ = load_policy(path)
    return [p.detach().clone() for p in model.parameters()]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_a_lineage_trained_in_segments_is_one_run(tiny_workspace_v0: Workspace) -> None:
    ws = tiny_workspace_v0
    with Engine(ws, poll_seconds=0.1) as engine:

        def child(parent: str, **changes: Any) -> str:
            name = engine.next_version_name()
            text = edit_toml(engine.config_text(parent), changes)
            change = {k: {"from": None, "to": v} for k, v in changes.items()}
            engine.create_version(VersionPlan(parent, name, {CONFIG_FILE: text}, "budget", "f", change, "h", "c", "r"))
            engine.train(name)
            return name

        long = child("v0", **{"recipe.steps": 2 * K})  # one run of 2K steps
        first = child("v0", **{"recipe.steps": K})  # K steps ...
        second = child(first)  # ... and K more: the no-change control of `first`
        fresh = child(first, **{"recipe.temperature": 0.7, "recipe.steps": 1})  # another change

        runs = {v: engine.train_run(v) for v in (long, first, second, fresh)}
        specs = {v: RunSpec.load(Path(r.run_dir)) for v, r in runs.items() if r is not None}
        # Who resumed: only the continuation, from its parent's kept final checkpoint, with the
        # KL reference of its lineage (v0's weights, where the long run's reference is too).
        assert specs[second].resume_from == ws.model_dir(first) / continuation.RESUME_DIR / f"checkpoint-{K}"
        assert specs[second].reference == ws.model_dir("v0")
        assert [specs[v].resume_from for v in (long, first, fresh)] == [None, None, None]  # v0 kept none

        # The same training: the same final weights, exactly, and they moved.
        w_long, w_second = weights(ws.model_dir(long)), weights(ws.model_dir(second))
        assert max_difference(w_long, w_second) == 0.0
        assert max_difference(w_long, weights(ws.model_dir(first))) > 0
        assert max_difference(w_long, weights(ws.model_dir("v0"))) > 0

        # The same data: the continuation's steps are the long run's later ones, not its first
        # ones, which a fresh child (another change) sees again.
        p_long, p_second, p_fresh = (train_prompts(engine.store, runs[v].id) for v in (long, second, fresh))  # type: ignore[union-attr]
        assert sorted(p_long) == list(range(1, 2 * K + 1))
        assert [p_second[s] for s in range(1, K + 1)] == [p_long[K + s] for s in range(1, K + 1)]
        assert all(p_second[s] != p_long[s] for s in range(1, K + 1))
        assert p_fresh[1] == p_long[1]

        # Steps stay the run's own: rollouts, metrics, the checkpoint event, the evaluation.
        run = runs[second]
        assert run is not None and run.total_steps == K
        assert sorted(p_second) == list(range(1, K + 1))
        metric_steps = engine.store.query(
            "SELECT DISTINCT step FROM metrics WHERE run_id = ? AND key = 'reward' ORDER BY step", [run.id]
        )
        assert metric_steps == [(s,) for s in range(1, K + 1)]
        evaluated = "SELECT DISTINCT step FROM rollouts WHERE run_id = ? AND split = 'val'"
        assert engine.store.query(evaluated, [run.id]) == [(K,)]
        events = read_events(Path(run.run_dir) / EVENTS_FILE, 0)[0]
        assert [e["step"] for e in events if e["type"] == "checkpoint"] == [K]
        assert [e["total_steps"] for e in events if e["type"] == "start"] == [K]
        # What the benchmark counts: each train run's last step.
        used = engine.store.query(
            "SELECT sum(s) FROM (SELECT max(step) AS s FROM rollouts WHERE split = 'train' AND run_id IN (?, ?, ?, ?)"
            " GROUP BY run_id)",
            [r.id for r in runs.values() if r is not None],
        )
        assert used == [(2 * K + K + K + 1,)]

        # Each version keeps its run's final checkpoint, at TRL's global step, and nothing else;
        # the runs' own checkpoints are gone.
        for version, step in ((long, 2 * K), (first, K), (second, 2 * K), (fresh, 1)):
            kept = ws.model_dir(version) / continuation.RESUME_DIR
            assert [p.name for p in kept.iterdir()] == [f"checkpoint-{step}"], version
            assert not (Path(runs[version].run_dir) / worker.TRAINER_DIR).exists()  # type: ignore[union-attr]
        assert not (ws.model_dir("v0") / continuation.RESUME_DIR).exists()


# -- a continuation killed and relaunched, across epochs ---------------------------------------------
#: Train prompts: with 8 prompts a step an epoch is 2 steps, so the continuation (steps 4..6 of the
#: lineage) starts in the middle of epoch 1 and crosses into epoch 2.
TRAIN_SIZE, SEGMENT, SAVE_EVERY = 16, 3, 2


class Killed(BaseException):
    """The worker dies here (what SIGKILL would do, short of ending the test's process)."""


def kill_at(monkeypatch: pytest.MonkeyPatch, name: str, n: int) -> None:
    """The next run dies the n-th time it reaches `faults.point(name)`."""
    left = [n]

    def point(reached: str) -> None:
        if reached == name:
            left[0] -= 1
            if left[0] == 0:
                monkeypatch.setattr(faults, "point", lambda _: None)
                raise Killed(name)

    monkeypatch.setattr(faults, "point", point)


def segment_config(root: Path, steps: int, **recipe: Any) -> WorkspaceConfig:
    text = tiny_toml((template_dir("sample") / CONFIG_FILE).read_text(), grpo_steps=steps, train_size=TRAIN_SIZE)
    config = parse_config(text.replace("[recipe.rewards]", f"save_every = {SAVE_EVERY}\n\n[recipe.rewards]"), root)
    return config.model_copy(update={"recipe": config.recipe.model_copy(update=recipe)}) if recipe else config


def train(root: Path, name: str, steps: int, model_in: Path, resume_from: Path | None = None, **recipe: Any) -> Path:
    """A train run through `worker.run_train` in this process (the recipe with `recipe`'s
    settings), resumed as a relaunched worker would be if it is killed; its run directory."""
    run_dir = root / name
    spec = RunSpec(
        run_id=name,
        version=name,
        kind="train",
        config=segment_config(root / CONFIG_FILE, steps, **recipe),
        model_in=model_in,
        model_out=root / "models" / name,
        resume_from=resume_from,
        reference=root / "v0" if resume_from is not None else None,
    )
    if not run_dir.exists():
        spec.save(run_dir)
    resuming = (run_dir / EVENTS_FILE).exists()
    events = EventLog(run_dir / EVENTS_FILE)
    try:
        worker.run_train(spec, run_dir, events, resuming)
    finally:
        events.close()
    return run_dir


def events_of(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run_dir / EVENTS_FILE, 0)[0] if e["type"] == kind]


def worker_prompts(run_dir: Path) -> dict[int, list[str]]:
    import pyarrow.parquet as pq

    out = {}
    for file in sorted((run_dir / "rollouts").glob("train-*.parquet")):
        table = pq.read_table(file, columns=["prompt", "sample_idx"]).to_pylist()
        out[int(file.stem.rpartition("-")[2])] = [r["prompt"] for r in table if r["sample_idx"] == 0]
    return out


@pytest.fixture(scope="module")
def lineage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A v0 (a short warm-up, as in test_resume_state), the long run of 2 segments from it, and
    the first segment."""
    root = tmp_path_factory.mktemp("lineage")
    config = segment_config(root / CONFIG_FILE, SEGMENT)
    domain = make_domain(config.domain)
    model, tokenizer = build_tiny_policy(config.policy.embedded, domain, seed=config.policy.warmup.seed)
    warmup_policy(model, tokenizer, domain, config.policy.warmup.model_copy(update={"batch_size": 8}))
    save_policy(model, tokenizer, root / "v0")
    train(root, "long", 2 * SEGMENT, root / "v0")
    train(root, "first", SEGMENT, root / "v0")
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("kill_step", "resumed_at"), [(1, -1), (3, 1)])
def test_a_continuation_killed_and_relaunched_is_still_the_long_run(
    lineage: Path, monkeypatch: pytest.MonkeyPatch, kill_step: int, resumed_at: int
) -> None:
    """Killed before its first checkpoint of its own (the continuation's step 1: its checkpoints
    fall on TRL's even steps, 4 and 6), it goes on from its parent's again; killed at its step 3,
    from its own of step 1."""
    root = lineage
    kept = continuation.kept_checkpoint(root / "models" / "first")
    assert kept is not None and kept.name == f"checkpoint-{SEGMENT}"
    name = f"second-killed-at-{kill_step}"
    kill_at(monkeypatch, "grpo-step", kill_step)
    with pytest.raises(Killed):
        train(root, name, SEGMENT, root / "models" / "first", kept)
    run_dir = train(root, name, SEGMENT, root / "models" / "first", kept)
    assert [(e["step"], e["final"]) for e in events_of(run_dir, "resume")] == [(resumed_at, False)]

    assert max_difference(weights(root / "models" / "long"), weights(root / "models" / name)) == 0.0
    p_long, p_second = worker_prompts(root / "long"), worker_prompts(run_dir)
    assert sorted(p_second) == list(range(1, SEGMENT + 1))
    assert [p_second[s] for s in range(1, SEGMENT + 1)] == [p_long[SEGMENT + s] for s in range(1, SEGMENT + 1)]
    assert {e["step"] for e in events_of(run_dir, "metrics")} == set(range(1, SEGMENT + 1))
    assert continuation.kept_checkpoint(root / "models" / name) == (
        root / "models" / name / continuation.RESUME_DIR / f"checkpoint-{2 * SEGMENT}"
    )


@pytest.mark.slow
def test_a_continuation_at_a_new_rate_is_the_long_run_with_the_rate_changed(lineage: Path) -> None:
    """One step on from `first` at three times its rate and one at its rate: both restore the same
    weights, moments, data position and RNG, so both compute the same first update direction,
    and AdamW's step (decay included) is linear in the rate: the faster one moves the weights
    exactly three times as far. Its optimizer goes on counting the lineage's steps (a fresh
    one would count from 1), and its trainer state logs the new rate from its first step."""
    root = lineage
    kept = continuation.kept_checkpoint(root / "models" / "first")
    assert kept is not None
    rate = segment_config(root / CONFIG_FILE, 1).recipe.learning_rate
    for name, lr in (("same-rate", rate), ("three-times", 3 * rate)):
        train(root, name, 1, root / "models" / "first", kept, learning_rate=lr)
    start = weights(root / "models" / "first")
    moved = {
        name: torch.cat([(w - w0).flatten() for w, w0 in zip(weights(root / "models" / name), start, strict=True)])
        for name in ("same-rate", "three-times")
    }
    assert float(moved["same-rate"].norm()) > 0
    error = (moved["three-times"] - 3 * moved["same-rate"]).norm() / (3 * moved["same-rate"]).norm()
    assert float(error) < 1e-3, float(error)

    resumed = continuation.kept_checkpoint(root / "models" / "three-times")
    assert resumed is not None and resumed.name == f"checkpoint-{SEGMENT + 1}"
    optimizer = torch.load(resumed / "optimizer.pt", weights_only=False)
    assert {g["lr"] for g in optimizer["param_groups"]} == {3 * rate}
    assert {int(s["step"]) for s in optimizer["state"].values()} == {SEGMENT + 1}
    history = json.loads((resumed / TRAINER_STATE_NAME).read_text())["log_history"]
    rates = {h["step"]: h["learning_rate"] for h in history if "learning_rate" in h}
    assert rates == {**{s: rate for s in range(1, SEGMENT + 1)}, SEGMENT + 1: 3 * rate}, rates


@pytest.mark.slow
def test_a_continuation_keeps_its_lineage_reference_for_the_kl_term(lineage: Path) -> None:
    """With `beta` > 0 TRL anchors the KL term to a reference policy: a continuation's is the one
    its lineage started from (v0 here), as in the long run, not its parent's final weights."""
    root = lineage
    kept = continuation.kept_checkpoint(root / "models" / "first")
    spec = RunSpec(
        run_id="kl",
        version="kl",
        kind="train",
        config=segment_config(root / CONFIG_FILE, SEGMENT, beta=0.04),
        model_in=root / "models" / "first",
        model_out=root / "models" / "kl",
        resume_from=kept,
        reference=root / "v0",
    )
    trainer = worker.build_grpo_trainer(spec, root / "kl", EventLog(None))
    assert trainer.ref_model is not None
    reference = [p.detach() for p in trainer.ref_model.parameters()]
    assert max_difference(reference, weights(root / "v0")) == 0.0
    assert max_difference(reference, weights(root / "models" / "first")) > 0
    assert trainer.model.config.name_or_path == str(root / "models" / "first")  # the policy's own name stays
