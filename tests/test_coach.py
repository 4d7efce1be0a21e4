"""The coach: interventions, the offline planner, gates, decisions, memory, harness evolution and
backend fallback. Everything here runs without training; the real loop is the slow test at the end."""

from __future__ import annotations

import json
import math
from dataclasses import FrozenInstanceError, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import git
import numpy as np
import pydantic
import pytest
import tomli_w

from engine.coach.backends.base import AnalyzerSpec, BackendError, ModelCall, PlanningContext, Proposals
from engine.coach.backends.offline import OfflinePlanner, feedback_preferences
from engine.coach.evolution import (
    TRAIN_ROWS,
    UnsafeSQLError,
    check_sql,
    evolve,
    find_anomaly,
    over_completions,
    revalidate,
)
from engine.coach.gates import Answer, GateError, Gates, auto_approve
from engine.coach.interventions import TEMPLATES, Facts, Intervention, InterventionError, apply, check, run_facts
from engine.coach.loop import Coach, WaitingAtGate, proposed_decision
from engine.coach.memory import Memory, failure_signature
from engine.coach.rounds import Branch, Round, Rounds
from engine.config import CONFIG_FILE, DataConfig, parse_config
from engine.core import Engine, VersionPlan
from engine.harness.base import Finding, RuleResult, Severity
from engine.harness.diagnose import Diagnosis
from engine.harness.loader import load_harness
from engine.harness.rules import BLOCKING_RULES
from engine.runs.group_filter import GroupFilter
from engine.store import Store
from engine.verdict import Delta, Verdict, compare_runs, paired_bootstrap
from engine.workspace import Workspace
from tests.harness_data import Rollout, RunBuilder

CONFIG = parse_config('[workspace]\nname = "t"\n', Path("t.toml"))
#: a recipe that takes two optimizer passes per generation batch, where the clip binds
TWO_PASSES = parse_config('[workspace]\nname = "t"\n[recipe]\nnum_iterations = 2\n', Path("t.toml"))


def rule(name: str, severity: Severity = "warning", metrics: tuple[str, ...] = ()) -> RuleResult:
    return RuleResult(f"{name} fired", severity, metrics, rule=name)


def diagnosis_of(rules: list[RuleResult] | None = None, findings: list[Finding] | None = None) -> Diagnosis:
    return Diagnosis("v1-train-1-diagnosis", "v1", "v1-train-1", "test", findings or [], rules or [])


def context(rules: list[RuleResult] | None = None, **kw: Any) -> PlanningContext:
    kw.setdefault("parent_config", CONFIG)
    return PlanningContext(parent="v0", domain="math", diagnosis=diagnosis_of(rules), **kw)


# -- interventions -------------------------------------------------------------------------------
def test_a_multi_factor_change_is_refused_unless_it_cites_evidence() -> None:
    two = {"recipe.learning_rate": 4e-5, "recipe.temperature": 0.8}
    with pytest.raises(InterventionError, match="2 factors"):
        check(Intervention(kind="optimizer", changes=two, hypothesis="h"))
    check(Intervention(kind="optimizer", changes=two, hypothesis="h", evidence=["rule:exploration_collapse"]))
    # A whole reward composition is one factor, however many weights it sets.
    rewards = Intervention(
        kind="reward", changes={"recipe.rewards": {"correctness": 1.0, "closeness": 0.5}}, hypothesis="h"
    )
    assert rewards.factors == ["recipe.rewards"]
    check(rewards)


def test_applying_an_intervention_validates_the_child_config_and_names_the_field() -> None:
    parent = "[workspace]\nname = 't'\n[recipe]\nlearning_rate = 2e-5\n"
    text, config = apply(
        Intervention(kind="optimizer", changes={"recipe.learning_rate": 4e-5}, hypothesis="h"), parent, Path("c.toml")
    )
    assert config.recipe.learning_rate == 4e-5 and "learning_rate = 4e-05" in text
    with pytest.raises(InterventionError, match="recipe.loss_type"):
        apply(
            Intervention(kind="optimizer", changes={"recipe.loss_type": "ppo"}, hypothesis="h"), parent, Path("c.toml")
        )


# -- the offline planner -------------------------------------------------------------------------
def test_the_planner_answers_the_bottleneck_with_different_factors() -> None:
    ctx = context([rule("insufficient_signal", "critical", ("signal.dead_group_ratio",))], branches=2)
    proposals = OfflinePlanner().propose(ctx)
    templates = [iv.template for iv in proposals.interventions]
    # The first two catalog templates that answer insufficient_signal, in catalog order.
    expected = [t.name for t in TEMPLATES.values() if "insufficient_signal" in t.triggers][:2]
    assert templates == expected
    assert len({f for iv in proposals.interventions for f in iv.factors}) == 2
    assert all("rule:insufficient_signal" in iv.evidence for iv in proposals.interventions)
    assert "finding:signal.dead_group_ratio" in proposals.interventions[0].evidence


def test_a_leak_closes_the_history_and_turn_loops_draw_the_efficiency_reward() -> None:
    text = '[workspace]\nname = "t"\n[domain]\nname = "swe"\nleak_fix_in_history = true\n'
    swe = parse_config(text + "[recipe.rewards]\ncorrectness = 1.0\n", Path("t.toml"))
    leaked = replace(context([rule("leak", "critical")], branches=1), parent_config=swe, domain="swe")
    (iv,) = OfflinePlanner().propose(leaked).interventions
    assert (iv.template, iv.kind, iv.changes) == ("close_leak", "environment", {"domain.leak_fix_in_history": False})
    _, child = apply(iv, tomli_w.dumps(swe.model_dump(mode="json", exclude_none=True)), Path("c.toml"))
    assert child.domain.leak_fix_in_history is False  # type: ignore[union-attr]

    looping = replace(leaked, diagnosis=diagnosis_of([rule("echo_trap")]))
    (iv,) = OfflinePlanner().propose(looping).interventions
    assert iv.template == "efficiency_reward" and iv.changes["recipe.rewards"]["efficiency"] > 0
    # Math has no efficiency component and no history: neither template applies there.
    math = context([rule("echo_trap"), rule("leak", "critical")], branches=3)
    templates = {iv.template for iv in OfflinePlanner().propose(math).interventions}
    assert templates and templates.isdisjoint({"efficiency_reward", "close_leak"})


def test_the_planner_skips_what_was_tried_and_what_case_memory_says_failed() -> None:
    fired = [rule("insufficient_signal")]
    first = [t.name for t in TEMPLATES.values() if "insufficient_signal" in t.triggers]
    failed = {"template": first[0], "decision": "rejected", "exact": True}
    ctx = context(fired, branches=1, tried_templates=[first[1]], cases=[failed])
    (iv,) = OfflinePlanner().propose(ctx).interventions
    assert iv.template == first[2]
    # Escalated, the failed case no longer blocks (the planner may retry with new evidence).
    escalated = OfflinePlanner().propose(context(fired, branches=1, cases=[failed], escalated=True))
    assert escalated.interventions[0].template != first[1]


def test_feedback_steers_the_planner() -> None:
    preferred, excluded = feedback_preferences(["Avoid the learning rate. Try clip-higher instead"])
    assert {"raise_lr", "lower_lr"} <= excluded and "clip_higher" in preferred
    feedback = ["don't touch the learning rate; try clip-higher"]
    ctx = context([], branches=2, feedback=feedback, parent_config=TWO_PASSES)
    templates = [iv.template for iv in OfflinePlanner().propose(ctx).interventions]
    assert templates[0] == "clip_higher" and "raise_lr" not in templates


def test_clip_higher_is_offered_only_where_the_clip_binds() -> None:
    # One optimizer pass per generation batch: the policy ratio is 1 and a clip change trains the
    # same model as the control, so the template offers nothing, even when asked for.
    ctx = context([rule("exploration_collapse")], branches=3, feedback=["try clip-higher"])
    assert "clip_higher" not in [iv.template for iv in OfflinePlanner().propose(ctx).interventions]
    assert TEMPLATES["clip_higher"].make(CONFIG, Facts(), None) is None
    assert TEMPLATES["clip_higher"].make(TWO_PASSES, Facts(), None) == {"recipe.epsilon_high": 0.35}


def test_escalation_prefers_removing_a_component() -> None:
    fired = [rule("reward_hacking", "critical")]
    calm = OfflinePlanner().propose(context(fired, branches=1)).interventions[0]
    escalated = OfflinePlanner().propose(context(fired, branches=1, escalated=True)).interventions[0]
    assert TEMPLATES[escalated.template].removes
    removing = [t.name for t in TEMPLATES.values() if "reward_hacking" in t.triggers and t.removes]
    assert escalated.template == removing[0] and calm.template is not None


def test_escalation_answers_the_bottleneck_before_switching_layers() -> None:
    history = [{"parent": "v0", "kind": "optimizer", "verdict": "insufficient evidence", "template": "raise_lr"}]
    ctx = context([rule("shortcut_collapse")], branches=1, escalated=True, history=history)
    (iv,) = OfflinePlanner().propose(ctx).interventions
    answering = [t for t in TEMPLATES.values() if "shortcut_collapse" in t.triggers]
    # Both answers are optimizer changes (the failed layer); the one that removes comes first.
    assert iv.template == next(t.name for t in answering if t.removes)


def test_the_planner_cites_literature_that_mentions_its_change() -> None:
    hits = [{"doc": "literature/dapo.md", "title": "DAPO / clip-higher", "excerpt": "clip-higher raises epsilon_high"}]
    ctx = context([rule("exploration_collapse")], branches=1, literature=hits, parent_config=TWO_PASSES)
    (iv,) = OfflinePlanner().propose(ctx).interventions
    assert iv.template == "clip_higher" and "literature:literature/dapo.md" in iv.evidence


# -- gates ----------------------------------------------------------------------------------------
def test_gate_state_machine(tmp_path: Path) -> None:
    gates = Gates(Store(tmp_path / "evo.duckdb"))
    g = gates.open(1, "after_design", "round1", "Run 2 branches?", {"proposals": []}, forced=False)
    assert g.state == "pending" and gates.pending() == [g]
    with pytest.raises(GateError, match="feedback"):
        Answer("revise", "  ")
    revised = gates.answer(g.id, Answer("revise", "smaller learning rate", by="cli"))
    assert revised.state == "revised" and revised.answer == Answer("revise", "smaller learning rate", by="cli")
    with pytest.raises(GateError, match="already answered"):
        gates.answer(g.id, Answer("approve"))
    assert gates.feedback() == ["smaller learning rate"]
    with pytest.raises(GateError, match=r"no gate 'g9'.*no gate is pending"):
        gates.get("g9")
    forced = gates.open(1, "after_completion", "v1", "Promote v1?", {}, forced=True)
    assert auto_approve(forced) is None  # forced gates need a person even with --auto-approve
    assert auto_approve(gates.open(2, "after_design", "round2", "q", {}, forced=False)) == Answer("approve", by="auto")
    assert gates.answer(forced.id, Answer("abort")).state == "aborted"


# -- honest decisions ------------------------------------------------------------------------------
def verdict_from(parent: np.ndarray, child: np.ndarray, decoding: str = "sampled") -> Verdict:
    low, high = paired_bootstrap(parent, child)
    return Verdict("v0", "v1", len(parent), (Delta(decoding, parent.mean(), child.mean(), low, high),))


def test_the_primary_comparison_decides_and_only_a_guardrail_blocks() -> None:
    """Two decodings are two tests: only the pre-declared one decides; the other blocks a gain only
    as a declared guardrail, when its whole interval lies below -margin."""
    up, flat, down = (
        Delta("x", 0.4, 0.5, 0.05, 0.15),
        Delta("x", 0.4, 0.41, -0.02, 0.04),
        Delta("x", 0.4, 0.3, -0.15, -0.05),
    )

    def verdict(sampled: Delta, greedy: Delta, primary: str = "sampled", margin: float | None = None) -> str:
        deltas = (replace(sampled, decoding="sampled"), replace(greedy, decoding="greedy"))
        other = "greedy" if primary == "sampled" else "sampled"
        guardrails = () if margin is None else ((other, margin),)
        return Verdict("v0", "v1", 200, deltas, primary=primary, guardrails=guardrails).label

    assert verdict(up, flat) == "improved"
    assert verdict(flat, up) == "insufficient evidence"  # greedy alone rose: not the pre-declared test
    assert verdict(flat, up, primary="greedy") == "improved"
    assert verdict(up, down) == "improved"  # greedy fell, but nobody declared it a guardrail
    assert verdict(down, up) == "regressed"
    assert verdict(down, flat) == "regressed"
    # A guardrail blocks a gain when its whole interval is below -margin (down's is [-0.15, -0.05]).
    assert verdict(up, down, margin=0.0) == "mixed"
    assert verdict(up, down, margin=0.04) == "mixed"
    assert verdict(up, down, margin=0.05) == "improved"  # -0.05 is not below -0.05
    assert verdict(up, flat, margin=0.0) == "improved"  # flat's interval reaches above 0
    assert verdict(down, up, primary="sampled", margin=0.0) == "regressed"  # guards a gain, never rescues a loss
    mixed = Verdict(
        "v0",
        "v1",
        200,
        (replace(up, decoding="sampled"), replace(down, decoding="greedy")),
        guardrails=(("greedy", 0.02),),
    )
    assert "greedy (guardrail -0.02)" in mixed.summary() and "fell below its guardrail" in mixed.summary()
    summary = Verdict("v0", "v1", 200, (replace(flat, decoding="greedy"), replace(up, decoding="sampled"))).summary()
    assert summary.startswith("improved: sampled (primary) 0.400->0.500 (+0.100 ±0.050); greedy")


def test_decisions_follow_the_noise_floor_and_critical_findings() -> None:
    rng = np.random.default_rng(0)
    parent = (rng.random(200) < 0.5).astype(float)
    big_gain = parent.copy()
    big_gain[np.flatnonzero(parent == 0)[:60]] = 1.0  # 60 more tasks solved of 200
    small_gain = parent.copy()
    small_gain[np.flatnonzero(parent == 0)[:2]] = 1.0  # 2 more: inside the noise floor
    loss = parent.copy()
    loss[np.flatnonzero(parent == 1)[:60]] = 0.0

    assert proposed_decision(verdict_from(parent, big_gain), diagnosis_of())[0] == "promoted"
    assert proposed_decision(verdict_from(parent, big_gain), None)[0] == "promoted"
    assert proposed_decision(verdict_from(parent, small_gain), diagnosis_of())[0] == "pruned"
    assert proposed_decision(verdict_from(parent, loss), diagnosis_of())[0] == "rejected"
    leak = diagnosis_of([rule("leak", "critical"), rule("truncation", "warning")])
    decision, reason = proposed_decision(verdict_from(parent, big_gain), leak)
    assert decision == "rejected" and "rule leak is critical" in reason
    # A warning alone does not block a real gain, nor does a critical bottleneck: truncation says
    # what to change next, not that the gain is false (the SWE sample's gains were lost this way).
    assert proposed_decision(verdict_from(parent, big_gain), diagnosis_of([rule("truncation")]))[0] == "promoted"
    bottleneck = diagnosis_of([rule("truncation", "critical"), rule("insufficient_signal", "critical")])
    assert proposed_decision(verdict_from(parent, big_gain), bottleneck)[0] == "promoted"
    for suspect in sorted(BLOCKING_RULES):
        decision, _ = proposed_decision(verdict_from(parent, big_gain), diagnosis_of([rule(suspect, "critical")]))
        assert decision == "rejected", suspect


# -- memory ---------------------------------------------------------------------------------------
def test_consecutive_failures_reset_at_a_promotion(tmp_path: Path) -> None:
    store = Store(tmp_path / "evo.duckdb")
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    for i, state in enumerate(["rejected", "promoted", "pruned", "rejected", "failed"], start=1):
        store.add_version(f"v{i}", "v0", f"versions/v{i}", "b", state=state)
        store.update_version(f"v{i}", decided_at=f"2026-01-0{i} 00:00:00")
    assert Memory(store).consecutive_failures() == 3
    store.update_version("v5", state="promoted", decided_at="2026-01-06 00:00:00")
    assert Memory(store).consecutive_failures() == 0


def test_case_memory_by_signature(tmp_path: Path) -> None:
    memory = Memory(Store(tmp_path / "evo.duckdb"))
    sig = failure_signature(diagnosis_of([rule("truncation"), rule("insufficient_signal")]))
    assert sig == "insufficient_signal+truncation"
    memory.record_case(
        "v1", sig, "math", "v0", "optimizer", "raise_lr", "recipe.learning_rate", "regressed", "rejected", "r"
    )
    memory.record_case("v2", "truncation", "math", "v0", "budget", "longer_budget", "x", "improved", "promoted", "r")
    memory.record_case("v3", "leak", "math", "v0", "reward", "drop_shaping", "x", None, "pruned", "r")
    memory.record_case("v4", sig, "code", "v0", "reward", "drop_shaping", "x", None, "pruned", "r")
    found = memory.cases(sig, "math")
    assert [c["version"] for c in found] == ["v1", "v2"]  # exact first, then sharing a rule; same domain only
    assert found[0]["exact"] and not found[1]["exact"]


# -- harness evolution ----------------------------------------------------------------------------
def judged_store(path: Path, lengths: dict[str, tuple[str, int]]) -> Store:
    """Versions with a verdict and a train run whose completions have a given length."""
    store = Store(path)
    store.add_version("v0", None, "versions/v0", "a", state="promoted")
    return add_judged(store, lengths)


def add_judged(store: Store, lengths: dict[str, tuple[str, int]]) -> Store:
    for name, (verdict, length) in lengths.items():
        store.add_version(name, "v0", f"versions/{name}", "b", state="trained")
        store.update_version(name, verdict=verdict)
        builder = RunBuilder(store, run_id=f"{name}-train-1", version=name)
        builder.step(1, [[Rollout(1.0, length=length), Rollout(0.0, length=length)]])
        builder.save(1)
        store.update_run(f"{name}-train-1", state="succeeded")
    return store


LENGTH = AnalyzerSpec(
    name="length_mean",
    layer="behavior",
    sql="SELECT avg(completion_length) FROM completions",
    explanation="mean completion length",
)


def lengths(improved: list[int], regressed: list[int]) -> dict[str, tuple[str, int]]:
    """Judged versions v1.. with these completion lengths (improved ones first)."""
    verdicts = [("improved", n) for n in improved] + [("regressed", n) for n in regressed]
    return {f"v{i}": v for i, v in enumerate(verdicts, start=1)}


def test_evolution_adopts_an_analyzer_that_separates_and_refuses_one_that_does_not(tiny_workspace: Workspace) -> None:
    store = judged_store(tiny_workspace.root / "judged.duckdb", lengths([30, 25, 28, 40, 35], [8, 10, 9, 12, 11]))
    useless = AnalyzerSpec(
        name="reward_mean",
        layer="signal",
        sql="SELECT avg(reward) FROM completions",
        explanation="mean reward (the same in every version here)",
    )
    results = {r.spec.name: r for r in evolve(store, tiny_workspace.root, [LENGTH, useless], 1, existing=set())}
    validation = results["length_mean"].validation
    # 5 improved above 5 regressed: 2 of the C(10, 5) = 252 labellings separate as far (AUC 1 or 0),
    # below 0.05 / 2 (two specs tried together).
    assert results["length_mean"].adopted and validation.auc == 1.0
    assert validation.p_value == pytest.approx(2 / 252) and validation.alpha == pytest.approx(0.025)
    assert not results["reward_mean"].adopted and results["reward_mean"].validation.auc == 0.5
    assert "does not separate" in results["reward_mean"].reason
    # The adopted analyzer is a committed workspace analyzer that the harness loads and runs.
    harness = load_harness(tiny_workspace.root)
    adopted = [a for a in harness.analyzers if a.name == "length_mean"]
    assert adopted and adopted[0].provenance == "workspace" and not harness.problems
    import git

    assert git.Repo(tiny_workspace.root).head.commit.hexsha == results["length_mean"].commit_sha
    rows = store.query("SELECT name, adopted FROM harness_proposals ORDER BY id")
    assert rows == [("length_mean", True), ("reward_mean", False)]


def test_an_adopted_analyzer_blocks_a_run_beyond_every_improved_version(tiny_workspace: Workspace) -> None:
    """Adopted from lengths where improved versions wrote 25 to 40 and regressed ones 8 to 12: a
    later run below 25 (the improved versions' edge) is a critical finding that blocks; one
    inside the improved versions' range is reported only."""
    store = judged_store(tiny_workspace.root / "judged.duckdb", lengths([30, 25, 28, 40, 35], [8, 10, 9, 12, 11]))
    (result,) = evolve(store, tiny_workspace.root, [LENGTH], 1, existing=set())
    assert result.adopted
    add_judged(store, {"v11": ("improved", 20), "v12": ("improved", 27)})
    seen = {}
    for name in ("v11", "v12"):
        d = RunBuilder(store, run_id=f"{name}-train-1", version=name).diagnose_saved(workspace=tiny_workspace.root)
        (finding,) = [f for f in d.findings if f.metric == "behavior.length_mean"]
        assert finding.provenance == "workspace" and finding.threshold == 25
        seen[name] = (finding.severity, [r.rule for r in d.blocking])
    assert seen["v11"] == ("critical", ["workspace_critical"])
    assert seen["v12"] == ("info", [])


def test_specs_tried_together_are_held_to_a_corrected_level(tiny_workspace: Workspace) -> None:
    """4 a side separate perfectly at p = 2/70 = 0.029: enough alone (0.05), not when two specs
    were tried for the same anomaly (0.05 / 2 = 0.025)."""
    alone = judged_store(tiny_workspace.root / "alone.duckdb", lengths([30, 25, 28, 40], [8, 10, 9, 12]))
    (result,) = evolve(alone, tiny_workspace.root, [LENGTH], 1, existing=set())
    assert result.adopted and result.validation.p_value == pytest.approx(2 / 70)
    other = AnalyzerSpec(
        name="length_max", layer="signal", sql="SELECT max(length(text)) FROM completions", explanation="longest"
    )
    pair = judged_store(tiny_workspace.root / "pair.duckdb", lengths([30, 25, 28, 40], [8, 10, 9, 12]))
    again = LENGTH.model_copy(update={"name": "length_mean_2"})
    results = evolve(pair, tiny_workspace.root, [again, other], 1, existing={"length_mean"})
    assert not any(r.adopted for r in results)
    assert all("at p <= 0.0250" in r.reason and "does not separate" in r.reason for r in results)


@pytest.mark.parametrize(
    ("improved", "regressed"),
    [([30], [8]), ([30, 25], [8, 10]), ([30, 25, 28], [8, 10, 9])],
    ids=["one-each", "two-each", "three-each"],
)
def test_evolution_adopts_nothing_on_too_few_judged_versions(
    tiny_workspace: Workspace, improved: list[int], regressed: list[int]
) -> None:
    """A perfectly separating metric on too few versions is what chance gives: with k improved and
    k regressed versions, 2 of C(2k, k) labellings separate perfectly (p = 1, 1/3, 1/10)."""
    store = judged_store(tiny_workspace.root / "judged.duckdb", lengths(improved, regressed))
    (result,) = evolve(store, tiny_workspace.root, [LENGTH], 1, existing=set())
    k = len(improved)
    assert result.validation.auc == 1.0 and result.validation.p_value == pytest.approx(2 / math.comb(2 * k, k))
    assert not result.adopted and "does not separate" in result.reason
    assert not (tiny_workspace.root / "harness" / "length_mean.py").exists()


def test_escalation_retires_an_adopted_analyzer_that_no_longer_separates(tiny_workspace: Workspace) -> None:
    root = tiny_workspace.root
    store = judged_store(root / "judged.duckdb", lengths([30, 25, 28, 40], [8, 10, 9, 12]))
    (adopted,) = evolve(store, root, [LENGTH], 1, existing=set())
    assert adopted.adopted and (root / "harness" / "length_mean.py").exists()
    # Four more judged versions, where length goes the other way: the metric no longer separates.
    add_judged(store, {f"v{i}": v for i, v in enumerate(lengths([8, 9, 11, 12], [30, 31, 32, 33]).values(), 9)})
    check = revalidate(store, root, 2)
    assert check.retired and check.retired[0][0] == "harness/length_mean.py"
    assert "does not separate" in check.retired[0][1]
    assert not (root / "harness" / "length_mean.py").exists()
    assert "retire analyzer length_mean" in git.Repo(root).head.commit.message
    assert "length_mean" not in {a.name for a in load_harness(root).analyzers}
    # Nothing is left to retire on a second look; both looks are stored.
    assert revalidate(store, root, 3).retired == []
    assert store.query("SELECT count(*) FROM backtests WHERE kind = 'harness_revalidation'") == [(2,)]


def test_the_claude_backend_is_told_and_held_to_the_factors_this_parent_tried(engine: Engine) -> None:
    """The ledger records factors (recipe.learning_rate); the model's proposals are checked
    against them, not against catalog template names it never uses."""
    from engine.coach.backends.anthropic_backend import _MalformedOutput, _parse_proposals

    iv = TEMPLATES["raise_lr"].propose(engine.version_config("v0"), [])
    assert iv is not None
    child(engine, "v1", iv)
    engine.decide("v1", "pruned", "insufficient evidence")
    ctx, _ = Coach(engine, answer=auto_approve).planner.context(
        Round(2, "v0", "open", "design", "anthropic", "full", False), None, 1
    )
    assert ctx.tried_templates == ["raise_lr"] and ctx.tried_factors == ["recipe.learning_rate"]
    lower = {"kind": "optimizer", "changes": {"recipe.learning_rate": 1e-5}, "hypothesis": "h"}
    with pytest.raises(_MalformedOutput, match="already tried"):
        _parse_proposals({"rationale": "r", "interventions": [lower]}, ctx)
    temperature = {"kind": "optimizer", "changes": {"recipe.temperature": 1.2}, "hypothesis": "h"}
    assert _parse_proposals({"rationale": "r", "interventions": [temperature]}, ctx).interventions


def test_no_coach_code_sets_an_engine_attribute() -> None:
    """What varies per call (harness layers, callbacks) is an argument: the coach never changes
    the engine it drives."""
    import ast

    import engine.coach

    offenders = []
    for path in Path(engine.coach.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                base = t.value if isinstance(t, ast.Attribute) else None
                if isinstance(base, ast.Attribute) and base.attr == "engine":
                    offenders.append(f"{path.name}:{node.lineno}")
                elif isinstance(base, ast.Name) and base.id == "engine":
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []


def test_evolution_sql_may_only_read_completions() -> None:
    check_sql("WITH a AS (SELECT length(text) AS n FROM completions) SELECT avg(n) FROM a")
    for bad in (
        "COPY rollouts TO '/tmp/x'",
        "SELECT 1; DROP TABLE rollouts",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT avg(value) FROM metrics",  # another table of the store
        "SELECT count(*) FROM completions, versions",
        "SELECT count(*) FROM completions, probe_rows",  # what an investigation's probes read
        "SELECT 42",  # reads nothing to measure
    ):
        with pytest.raises(UnsafeSQLError):
            check_sql(bad)
    # Bound to one run's train rollouts, or to one sampled val pass, it runs as a single query.
    sql = over_completions("WITH a AS (SELECT length(text) AS n FROM completions) SELECT avg(n) FROM a", TRAIN_ROWS)
    assert sql.startswith("WITH completions AS (") and sql.count("WITH") == 1


def test_an_anomaly_is_a_score_move_no_rule_or_finding_explains() -> None:
    def dead(value: float) -> list[Finding]:
        return [Finding("signal.dead_group_ratio", value, layer="signal")]

    parent, same, moved = (
        diagnosis_of(findings=dead(0.2)),
        diagnosis_of(findings=dead(0.21)),
        diagnosis_of(findings=dead(0.6)),
    )
    assert find_anomaly("improved", same, parent) is not None
    assert find_anomaly("improved", moved, parent) is None  # the signal layer explains it
    assert find_anomaly("improved", diagnosis_of([rule("leak")]), parent) is None
    assert find_anomaly("insufficient evidence", same, parent) is None


# -- the group filter -----------------------------------------------------------------------------
def test_group_filter_keeps_spread_groups_up_to_the_keep_ratio() -> None:
    spreads = np.array([0.0, 0.4, 0.0, 0.2, 0.5, 0.1])
    assert GroupFilter(1e-3).keep(spreads).tolist() == [False, True, False, True, True, True]
    # keep_ratio 0.5 of 6 groups -> the 3 largest spreads
    assert GroupFilter(1e-3, keep_ratio=0.5).keep(spreads).tolist() == [False, True, False, True, True, False]
    f = GroupFilter(0.0, ema=0.5)
    f.keep(spreads)
    assert f.threshold == pytest.approx(0.5 * 0.0 + 0.5 * float(np.median(spreads)))


# -- the coach on a workspace (no training) --------------------------------------------------------
def child(engine: Engine, name: str, iv: Intervention, parent: str = "v0", round: int | None = None) -> None:
    text, config = apply(iv, engine.config_text(parent), Path(CONFIG_FILE))
    engine.create_version(
        VersionPlan(
            parent, name, {CONFIG_FILE: text}, iv.kind, iv.factor, {}, iv.hypothesis, "c", "r", round, iv.template
        )
    )


@pytest.fixture
def engine(tiny_workspace: Workspace) -> Engine:
    engine = Engine.open(tiny_workspace.root)
    sha = engine.tree.create_base("v0")
    engine.store.add_version("v0", None, "versions/v0", sha, state="promoted")
    yield engine
    engine.close()


def without_control(engine: Engine) -> Engine:
    """The engine of a workspace with `[coach] control = false` (a coach reads its config at start)."""
    coach = engine.config.coach.model_copy(update={"control": False})
    engine.config = engine.config.model_copy(update={"coach": coach})
    return engine


def test_a_success_becomes_a_skill_that_a_matching_trigger_retrieves(engine: Engine) -> None:
    # Without a control (`[coach] control = false`) a promotion's card is credited against the parent.
    coach = Coach(without_control(engine), answer=auto_approve)
    iv = TEMPLATES["continuous_correctness"].propose(engine.version_config("v0"), ["rule:insufficient_signal"])
    assert iv is not None
    child(engine, "v1", iv)
    parent_diagnosis = diagnosis_of([rule("insufficient_signal", "critical")])
    rng = np.random.default_rng(1)
    before = (rng.random(100) < 0.3).astype(float)
    after = np.maximum(before, (rng.random(100) < 0.5).astype(float))
    rnd = coach.rounds.open("v0", "offline", "full", False)
    branch = Branch(intervention=iv, text="", change={}, title=iv.title(), version="v1")
    rnd = coach.rounds.propose(rnd, [branch], None)
    settled = coach.settler.settle(rnd, 0, parent_diagnosis, verdict_from(before, after), "promoted", "gain")
    assert settled.branches[0].done and coach.rounds.get(rnd.id) == settled

    (card,) = coach.skills.load()
    assert card.trigger == ["insufficient_signal"] and card.intervention["template"] == "continuous_correctness"
    assert card.validation[0]["delta_sampled"] == pytest.approx(after.mean() - before.mean())
    assert card.validation[0]["control"] is None and "no control" in card.expected_outcome
    assert engine.store.get_version("v1").state == "promoted"
    (case,) = Memory(engine.store).cases("insufficient_signal", "math")
    assert case["decision"] == "promoted"

    # A later round whose parent shows the same rule retrieves the card, and the planner leads with it.
    ctx, _ = coach.planner.context(coach.rounds.open("v1", "offline", "full", False), parent_diagnosis, 2)
    assert [s["id"] for s in ctx.skills] == [card.id]
    assert coach.skills.match(["truncation"], "math") == []


def test_a_round_is_a_value_and_each_transition_stores_and_returns_the_next_one(engine: Engine) -> None:
    """Forgetting to save a round is impossible: a transition returns a new round that is already the
    stored one, the round it was given stays as it was, and neither a round nor a branch can be edited."""
    rounds = Rounds(engine.store)
    opened = rounds.open("v0", "offline", "full", False)
    iv = Intervention(kind="optimizer", changes={"recipe.temperature": 1.2}, hypothesis="h")
    proposed = rounds.propose(opened, [Branch(intervention=iv, text="", change={}, title=iv.title())], "why")
    assert rounds.get(opened.id) == proposed and proposed.rationale == "why" and len(proposed.branches) == 1
    designed = rounds.advance(proposed, "backtest")
    dropped = rounds.update_branch(designed, 0, dropped="contradicted by its backtest")
    assert rounds.get(opened.id) == dropped and dropped.stage == "backtest"
    assert dropped.branches[0].dropped == "contradicted by its backtest"
    # The values the transitions were given are unchanged.
    assert (opened.stage, opened.branches, opened.rationale) == ("diagnosis", (), None)
    assert proposed.stage == "diagnosis" and designed.branches[0].dropped is None
    ended = rounds.end(dropped)
    assert (ended.state, ended.stage) == ("done", "done") and dropped.state == "open"
    assert rounds.current() is None and rounds.get(opened.id) == ended
    # Edited in place, a round or a branch raises; so does a field a branch does not have.
    with pytest.raises(FrozenInstanceError):
        dropped.stage = "run"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        dropped.branches[0].done = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        dropped.branches.append(dropped.branches[0])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="no field versoin"):
        rounds.update_branch(dropped, 0, versoin="v1")
    assert rounds.get(opened.id) == ended


def test_a_round_from_a_base_without_grpo_backtests_on_the_run_it_reasons_from(engine: Engine) -> None:
    """v0 has no GRPO run of its own; after a failed branch, the round's diagnosis comes from that
    branch's run, and the filter backtest replays the same run."""
    engine.store.add_version("v1", "v0", "versions/v1", "b", state="pruned")
    dead, live = [Rollout(0.0)] * 4, [Rollout(0.0), Rollout(1.0), Rollout(0.0), Rollout(0.0)]
    RunBuilder(engine.store).step(1, [dead, dead, live]).save(1)
    engine.store.update_run("v1-train-1", state="succeeded")
    engine.store.con.execute(
        "INSERT INTO diagnoses (id, version, run_id, harness_revision, rules, candidate_kinds)"
        " VALUES ('d1', 'v1', 'v1-train-1', 'r', '[]', '[]')"
    )
    iv = TEMPLATES["group_filter"].propose(engine.version_config("v0"), ["rule:insufficient_signal"])
    assert iv is not None
    coach = Coach(engine, answer=auto_approve)
    engine.store.con.execute(
        "INSERT INTO rounds (id, parent, state, stage, backend, harness, escalated, proposals, diagnosis)"
        " VALUES (1, 'v0', 'open', 'backtest', 'offline', 'full', false, ?, 'd1')",
        [json.dumps([{"intervention": iv.model_dump(), "title": iv.title(), "text": "", "change": {}}])],
    )
    rnd = coach.rounds.get(1)
    backtested = coach.designer.backtest(rnd, Diagnosis("d1", "v1", "v1-train-1", "r", [], []))
    assert coach.rounds.get(1) == backtested and backtested.stage == "run"
    (branch,) = backtested.branches
    assert branch.backtest and branch.backtest["summary"].startswith("keeps 33% of groups")  # 1 of 3 has a spread
    assert engine.store.query("SELECT run_id FROM backtests") == [("v1-train-1",)]


def test_case_memory_is_consulted_and_traced(engine: Engine) -> None:
    coach = Coach(engine, answer=auto_approve)
    memory = Memory(engine.store)
    memory.record_case(
        "v7", "none", "math", "v0", "optimizer", "raise_lr", "recipe.learning_rate", "regressed", "rejected", "r"
    )
    rnd = coach.open_round()
    ctx, _ = coach.planner.context(rnd, diagnosis_of(), 2)
    assert [c["version"] for c in ctx.cases] == ["v7"]
    proposals = coach.planner.propose(rnd, diagnosis_of(), 2)
    assert "raise_lr" not in [iv.template for iv in proposals.interventions]
    traced = {r["source"]: r for r in memory.retrievals(rnd.id)}
    assert traced["cases"]["adopted"] == ["v7"] and traced["cases"]["query"] == "none"
    assert traced["literature"]["hits"], "the sample literature answers a stalled-training query"


class BrokenBackend:
    name = "anthropic"

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []

    def propose(self, ctx: PlanningContext) -> Proposals:
        self.calls.append(ModelCall("anthropic", "m", "propose", ok=False, error="HTTP 500"))
        raise BackendError("HTTP 500 api_error")

    def propose_analyzer(self, anomaly: dict[str, Any], ctx: PlanningContext) -> list[AnalyzerSpec]:
        raise BackendError("HTTP 500 api_error")


def test_a_failing_model_backend_falls_back_to_offline_with_a_recorded_reason(engine: Engine) -> None:
    events: list[str] = []
    coach = Coach(engine, backend=BrokenBackend(), answer=auto_approve, on_event=lambda e: events.append(e.kind))
    proposals = coach.planner.propose(coach.open_round(), None, 2)
    assert proposals.backend == "offline" and proposals.interventions
    assert "fallback" in events
    (reason,) = [
        r[0] for r in engine.store.query("SELECT payload->>'message' FROM events WHERE kind = 'coach_fallback'")
    ]
    assert "HTTP 500" in reason
    assert engine.store.query("SELECT backend, ok, error FROM model_calls") == [("anthropic", False, "HTTP 500")]


def test_two_failures_switch_gates_on_and_three_escalate(engine: Engine) -> None:
    for i in (1, 2, 3):
        iv = Intervention(kind="optimizer", changes={"recipe.temperature": 0.5 + i / 10}, hypothesis="h")
        child(engine, f"v{i}", iv)
        engine.decide(f"v{i}", "rejected", "regressed")
        if i == 2:
            coach = Coach(engine, answer=auto_approve)  # after_diagnosis is off in the sample: forced now
            rnd = coach.open_round()
            with pytest.raises(WaitingAtGate) as waiting:
                coach.gatekeeper.ask(rnd, "after_diagnosis", "round", "go on?", {})
            assert waiting.value.gate.forced
            engine.store.con.execute("UPDATE rounds SET state = 'done'")
    coach = Coach(engine, answer=auto_approve)
    assert coach.open_round().escalated
    assert engine.store.query("SELECT count(*) FROM backtests WHERE kind = 'harness_revalidation'") == [(1,)]


def test_score_only_keeps_the_score_layer_alone() -> None:
    full = load_harness(None)
    ablated = full.only(("score",))
    assert {a.layer for a in ablated.analyzers} == {"score"}
    assert len(ablated.analyzers) < len(full.analyzers) and "score" in ablated.revision


# -- the real loop ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_real_tiny_loop_of_two_versions(tiny_workspace_v0: Workspace) -> None:
    with Engine.open(tiny_workspace_v0.root) as engine:
        result = Coach(engine, answer=auto_approve).run(2)
        assert len(result.trained) == 2 and result.waiting is None
        decided = {name: (decision, reason) for name, decision, reason in result.decisions}
        for name in result.trained:
            v = engine.store.get_version(name)
            assert v.state in ("promoted", "rejected", "pruned") and v.decision_reason
            assert decided[name][0] == v.state
            assert engine.tree.decision(name)[0] == v.state
            iv = engine.store.get_intervention(v.intervention_id)
            assert iv["template"] and iv["hypothesis"].startswith("If ")
        ivs = [engine.store.get_intervention(engine.store.get_version(n).intervention_id) for n in result.trained]
        assert len({iv["factor"] for iv in ivs}) == 2  # two different factors (branches, or rounds)
        assert engine.store.query("SELECT count(*) FROM cases") == [(2,)]
        rounds = engine.store.query("SELECT id, state FROM rounds ORDER BY id")
        assert {iv["round"] for iv in ivs} <= {r[0] for r in rounds} and {r[1] for r in rounds} == {"done"}
        gates = engine.store.query("SELECT kind, state, answered_by FROM gates ORDER BY id")
        assert gates[0] == ("after_design", "approved", "auto")
        assert {g[0] for g in gates} >= {"after_design", "after_completion"}


def test_a_loop_whose_backtests_drop_every_branch_stops_and_never_proposes_a_dropped_change_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every proposal is contradicted by its backtest: rounds must not repeat forever. A change a
    backtest dropped is not proposed again from the same parent, and the loop ends."""
    import engine.coach.design as design_module
    import engine.coach.loop as loop_module
    from engine.harness.backtest import InterventionBacktest

    engine.store.update_version("v0", checkpoint="models/v0")  # built: the loop trains no v0
    monkeypatch.setattr(engine, "train_run", lambda version: type("Run", (), {"id": "v0-train-0"})())
    monkeypatch.setattr(
        design_module, "backtest_intervention", lambda *a, **k: InterventionBacktest(None, "revives nothing", True)
    )
    coach = Coach(without_control(engine), answer=auto_approve)  # a control is never backtested
    result = coach.run(2)
    assert result.trained == [] and result.stopped is not None
    rounds = engine.store.query("SELECT id, proposals FROM rounds ORDER BY id")
    branches = [b for _, p in rounds for b in json.loads(p)]
    assert branches and all(b["dropped"] == "revives nothing" and b["version"] is None for b in branches)
    changes = [json.dumps(b["change"], sort_keys=True) for b in branches]
    assert len(changes) == len(set(changes))  # no dropped change came back in a later round
    assert len(rounds) <= loop_module.MAX_IDLE_ROUNDS


def test_the_claude_backend_through_the_coach_records_tokens_and_falls_back_on_errors(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.coach.backends.anthropic_backend import PROPOSE_TOOL, AnthropicBackend
    from tests.fake_messages_api import FakeMessagesAPI, server_error, tool_use_reply

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-coach-key")
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    change = {
        "kind": "optimizer",
        "changes": {"recipe.epsilon_high": 0.35},
        "hypothesis": "If clip-higher widens, exploration recovers, because rare tokens can grow.",
        "evidence": ["rule:exploration_collapse"],
    }
    reply = tool_use_reply(PROPOSE_TOOL, {"rationale": "entropy", "interventions": [change]}, input_tokens=321)
    with FakeMessagesAPI() as api:
        api.enqueue(reply, server_error(), server_error())
        backend = AnthropicBackend("claude-test", base_url=api.url, max_retries=1, timeout=5.0)
        coach = Coach(engine, backend=backend, answer=auto_approve)
        rnd = coach.open_round()
        first = coach.planner.propose(rnd, None, 1)
        assert first.backend == "anthropic" and first.interventions[0].changes == {"recipe.epsilon_high": 0.35}
        second = coach.planner.propose(rnd, None, 1)  # 500, retried once by the SDK, 500 again
        assert second.backend == "offline" and second.interventions
    calls = engine.store.query("SELECT backend, model, input_tokens, ok FROM model_calls ORDER BY id")
    assert calls[0] == ("anthropic", "claude-test", reply[1]["usage"]["input_tokens"], True)
    assert calls[-1][3] is False
    (reason,) = [
        r[0] for r in engine.store.query("SELECT payload->>'message' FROM events WHERE kind = 'coach_fallback'")
    ]
    assert "500" in reason and "sk-test-coach-key" not in reason


def test_anthropic_without_a_key_runs_offline_and_says_so(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    engine.config = engine.config.model_copy(
        update={"coach": engine.config.coach.model_copy(update={"backend": "anthropic"})}
    )
    events: list[str] = []
    coach = Coach(engine, answer=auto_approve, on_event=lambda e: events.append(e.message))
    assert coach.backend.name == "offline"
    assert any("ANTHROPIC_API_KEY is not set" in m for m in events)


def test_hopeless_prompts_are_found_in_sql_and_dropped_only_when_they_matter(engine: Engine) -> None:
    from engine.coach.interventions import Facts
    from engine.domains import make_domain
    from engine.runs.worker import grpo_dataset

    zero, one = Rollout(0.0), Rollout(1.0)
    # Groups are tasks t0..t3 (step 1) and t0, t1 again (step 2): t0 and t2 are never solved.
    builder = RunBuilder(engine.store, run_id="v0-train-1", version="v0")
    builder.step(1, [[zero, zero], [zero, one], [zero, zero], [one, one]]).step(2, [[zero, zero], [zero, zero]])
    for row in builder.rows:  # t0 and t2 are the "hard" subset
        row["subset"] = "hard" if row["task_id"] in ("t0", "t2") else "easy"
    builder.save(2)
    facts = run_facts(engine.store, "v0-train-1")
    # hard: t0 (4 samples) and t2 (2), none right; easy: t1 (4 samples, 1 right) and t3 (2 right).
    assert (facts.hopeless_tasks, facts.seen_tasks) == (("t0", "t2"), 4)
    assert facts.subset_success == (("hard", 0.0), ("easy", 3 / 6))
    assert facts.task_success == ((0, 4), (1, 4), (0, 2), (2, 2))  # (right, samples) of t0..t3
    assert facts.lengths is None  # three correct completions: too few to fit lengths on

    template = TEMPLATES["drop_hopeless"]
    config = engine.version_config("v0")
    iv = template.propose(config, [], facts=facts)
    assert iv is not None and iv.changes == {"data.exclude_tasks": ["t0", "t2"]}
    assert template.propose(config, [], facts=Facts(("t0",), 20)) is None  # 5% of the seen tasks: not worth a run
    # The worker trains on the rest, and refuses to train on nothing.
    domain = make_domain(config.domain)
    ids = [t.task_id for t in domain.tasks("train")]
    assert grpo_dataset(domain, DataConfig(exclude_tasks=ids[:3]))["task_id"] == ids[3:]
    with pytest.raises(ValueError, match="leave out all"):
        grpo_dataset(domain, DataConfig(exclude_tasks=ids))


def test_an_easier_mix_leaves_the_hardest_train_subset_out_and_val_alone(engine: Engine) -> None:
    from engine.coach.interventions import Facts
    from engine.domains import make_domain
    from engine.runs.worker import grpo_dataset

    template, config = TEMPLATES["easier_mix"], engine.version_config("v0")
    success = (("ops4", 0.1), ("ops3", 0.3), ("ops2", 0.6))
    iv = template.propose(config, [], facts=Facts(subset_success=success))
    assert iv is not None and iv.changes == {"data.exclude_subsets": ["ops4"]}
    assert template.propose(config, [], facts=Facts(subset_success=success[2:])) is None  # none would be left
    _, child_config = apply(iv, engine.config_text("v0"), Path(CONFIG_FILE))
    assert child_config.domain == config.domain  # same val tasks: the verdict compares like with like
    domain = make_domain(child_config.domain)
    trained = grpo_dataset(domain, child_config.data)
    subsets = {t.task_id: t.subset for t in domain.tasks("train")}
    assert trained.num_rows == sum(s != "ops4" for s in subsets.values()) > 0
    assert {subsets[t] for t in trained["task_id"]} == set(subsets.values()) - {"ops4"}


def evaluated(engine: Engine, version: str, splits: dict[str, list[float]], prompts: list[str] | None = None) -> None:
    """A succeeded evaluation run of `version`: per split, greedy and one sampled pass with these
    per-task correctness values (task t<i>, prompt p<i> unless `prompts` says otherwise)."""
    builder = RunBuilder(engine.store, run_id=f"{version}-eval-1", version=version)
    for split, values in splits.items():
        for decoding in ("greedy", "sampled"):
            first = 0 if decoding == "greedy" else 1
            builder.step(0, [[Rollout(v)] for v in values], split=split, decoding=decoding, first_sample=first)
    if prompts is not None:
        for row in builder.rows:
            row["prompt"] = prompts[int(row["task_id"][1:])]
    builder.save(0)
    engine.store.update_run(f"{version}-eval-1", state="succeeded", ended_at=datetime.now())


def test_a_child_that_changes_the_environment_is_judged_on_the_clean_replay(engine: Engine) -> None:
    """The parent's val leaked (0.5) but its clean replay solved nothing; a child whose change is
    to the environment is scored clean, so its 0.5 is a gain over the clean parent, not a tie."""
    iv = Intervention(kind="environment", changes={"domain.max_operand": 12}, hypothesis="h")
    child(engine, "v1", iv)
    half = [1.0, 0.0] * 20
    evaluated(engine, "v0", {"val": half, "clean": [0.0] * 40})
    evaluated(engine, "v1", {"val": half})
    verdict = engine.judge("v1")
    assert verdict.split == "clean" and verdict.label == "improved"
    assert [d.diff for d in verdict.deltas] == [pytest.approx(0.5)] * 2
    assert "clean environment" in verdict.summary()


def test_tasks_pair_by_id_and_prompt(engine: Engine) -> None:
    """A child whose val tasks carry the parent's ids but other prompts (its data changed) is
    compared on the tasks it shares with the parent, not on ids."""
    child(engine, "v1", Intervention(kind="optimizer", changes={"recipe.temperature": 1.1}, hypothesis="h"))
    evaluated(engine, "v0", {"val": [0.0] * 40})
    shared = [f"p{i}" for i in range(10)] + [f"other{i}" for i in range(30)]
    evaluated(engine, "v1", {"val": [1.0] * 40}, prompts=shared)
    verdict = engine.judge("v1")
    assert verdict.n_tasks == 10 and verdict.split == "val"
    # Nothing in common is no evidence, not an error that stops the loop.
    child(engine, "v2", Intervention(kind="optimizer", changes={"recipe.temperature": 1.2}, hypothesis="h"))
    evaluated(engine, "v2", {"val": [1.0] * 40}, prompts=[f"new{i}" for i in range(40)])
    nothing = compare_runs(engine.store, "v0", "v0-eval-1", "v2", "v2-eval-1")
    assert nothing.label == "insufficient evidence" and nothing.n_tasks == 0
    assert nothing.summary() == "insufficient evidence: no val tasks in common"


def test_round_one_reads_v0s_baseline_groups_so_the_full_loop_answers_its_rules(tiny_workspace_v0: Workspace) -> None:
    """v0 has no GRPO run, but its warm-up samples groups of the recipe's shape from it: every
    layer diagnoses them, so the full loop's first proposals answer what fired, while the
    score-only ablation, which sees no rule, falls back to the general templates."""
    with Engine.open(tiny_workspace_v0.root) as engine:
        engine.ensure_base()
        config = engine.version_config("v0")
        shape = config.policy.warmup.baseline_steps * config.recipe.prompts_per_step * config.recipe.num_generations
        assert engine.store.query("SELECT count(*) FROM rollouts WHERE split = 'train'") == [(shape,)]
        coaches = {mode: Coach(engine, answer=auto_approve, harness=mode) for mode in ("full", "score-only")}
        diagnoses = {mode: c.ctx.parent_diagnosis("v0") for mode, c in coaches.items()}
        assert diagnoses["full"] is not None and diagnoses["full"].rule_names
        assert diagnoses["score-only"] is not None and not diagnoses["score-only"].rule_names
        rnd = coaches["full"].rounds.open("v0", "offline", "full", False)
        proposed = {
            mode: [iv.template for iv in c.planner.propose(rnd, diagnoses[mode], 2).interventions]
            for mode, c in coaches.items()
        }
        assert proposed["full"] != proposed["score-only"]
        general = [t.name for t in TEMPLATES.values() if "" in t.triggers]
        assert set(proposed["score-only"]) <= set(general)
        assert not set(proposed["full"]) <= set(general)
