"""The autonomy benchmark: five arms on one workspace, the same v0, data and GRPO-step budget.

- **base**: v0 as it is;
- **hand**: the workspace's hand-made recipe (`[bench] hand_recipe`), one version trained for the
  whole budget;
- **score-only**: the coach with the score layer of the harness alone (the ablation);
- **random**: random search: the same catalog, templates and magnitudes drawn at random (seeded
  with the benchmark seed, `engine.coach.backends.random_search`), judged and decided by the same
  rule as the full loop (the full harness), within the same budget;
- **full**: the coach with the full, evolving harness.

Each seed clones the workspace's committed state into `<ws>/.evotrainer/bench/<id>/seed<k>/`,
builds v0 there once, and copies that clone for every arm, so the arms start from the same
policy and store. The training arms of a seed run side by side in `lanes` processes, each run
with its share of the cores as torch threads (`engine.bench.lanes`); with one lane, one after the
other in this process.
A loop arm runs coach rounds until its versions have used the budget's GRPO steps; every gate is
answered yes. Scores are measured on the clean environment: with the SWE leak switch on, every
evaluation also plays val clean (split ``clean``), and that is what the benchmark reports; the
arms themselves decide on what they see.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import git

from engine.coach.backends.random_search import RandomPlanner
from engine.coach.gates import Answer, Gate
from engine.coach.interventions import CONTROL, config_changes, edit_toml
from engine.coach.loop import Coach, CoachEvent
from engine.coach.schedule import CONTINUE, steps_spent
from engine.config import CONFIG_FILE, WorkspaceConfig, parse_config, read_config
from engine.core import BASE, Engine, ProgressFn, RunUpdate, VersionPlan
from engine.domains import make_domain
from engine.harness.rules import is_blocking
from engine.runs.artifacts import worker_cpu_seconds
from engine.store import RunRecord, Store
from engine.verdict import Scores, clean_split, per_task_correctness, split_scores
from engine.versions import ACTOR
from engine.workspace import STATE_DIR, Workspace, init_workspace

ARMS = ("base", "hand", "score-only", "random", "full")
#: The arms that train, each in its own copy of the seed's clone (they may run side by side).
TRAINED = ARMS[1:]

Say = Callable[[str], None]


@dataclass(frozen=True)
class BenchSettings:
    """What one `evotui bench` invocation runs (the workspace's `[bench]`, with the CLI's overrides)."""

    budget_steps: int
    version_steps: int
    seeds: tuple[int, ...]
    quick: bool = False
    val_size: int | None = None
    test_size: int | None = None
    warmup_steps: int | None = None
    leak_rate: float = 0.0
    transfer_from: str = ""
    hand_recipe: dict[str, Any] = field(default_factory=dict)
    #: Jobs run side by side (None: `engine.bench.lanes.default_lanes`, one per core up to the
    #: four training arms); 1: everything in this process, one after the other.
    lanes: int | None = None

    @classmethod
    def from_config(
        cls,
        config: WorkspaceConfig,
        quick: bool = False,
        budget: int | None = None,
        seeds: list[int] | None = None,
        lanes: int | None = None,
    ) -> BenchSettings:
        b = config.bench
        return cls(
            budget_steps=budget or (b.quick_budget_steps if quick else b.budget_steps),
            version_steps=b.quick_version_steps if quick else b.version_steps,
            seeds=tuple(seeds or (b.seeds[:1] if quick else b.seeds)),
            quick=quick,
            val_size=b.quick_val_size if quick else b.val_size,
            test_size=b.quick_test_size if quick else b.test_size,
            warmup_steps=b.quick_warmup_steps if quick else None,
            leak_rate=b.leak_rate,
            transfer_from="" if quick else b.transfer_from,
            hand_recipe=dict(b.hand_recipe),
            lanes=lanes or b.lanes,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchSettings:
        return cls(**{**data, "seeds": tuple(data["seeds"])})


@dataclass
class VersionRow:
    """One version an arm trained (or v0), as the report shows it."""

    name: str
    parent: str | None
    change: str
    template: str | None
    steps: int
    decision: str
    reason: str
    seen_greedy: float | None  # val as the arm saw it (leaky when the switch was on)
    clean_greedy: float | None
    clean_sampled: float | None
    train_reward: float | None  # mean train reward over the run's last quarter
    train_correct: float | None
    rules: list[str]
    #: The rules among them that stand against a promotion (`BLOCKING_RULES`, critical).
    blocking: list[str] = field(default_factory=list)
    cpu_seconds: float | None = None  # of the coach call that trained it (its run, evaluation and diagnosis)
    #: Sampled correctness on test, for the versions the report reads (an arm's promoted lineage) ...
    test_sampled: float | None = None
    #: ... and per test task (the sampled passes' mean), for paired comparisons with other arms.
    test_per_task: dict[str, float] = field(default_factory=dict)


@dataclass
class ArmResult:
    arm: str
    seed: int
    workspace: str
    final: str
    clean_greedy: float | None  # the final version's val, clean (what the arm decided on, without a leak)
    clean_sampled: float | None
    clean_halfwidth: float | None  # 95% interval half-width of the clean sampled score over val tasks
    seen_greedy: float | None
    steps: int
    cpu_seconds: float  # training, evaluation on val and diagnosis; not the report's test evaluations
    wall_seconds: float
    versions: list[VersionRow]
    stopped: str | None = None
    #: The report's scores: the final version on test, which no arm decided on.
    test_greedy: float | None = None
    test_sampled: float | None = None
    test_halfwidth: float | None = None
    #: Per test task, the sampled passes' mean: for paired comparisons between arms.
    test_per_task: dict[str, float] = field(default_factory=dict)
    #: The same, played with the leak (split `test_leaky`; empty when the environment has none):
    #: the final version's leaky-minus-clean gap is the leak finding's outcome.
    test_leaky_per_task: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ArmResult:
        return cls(**{**data, "versions": [VersionRow(**v) for v in data["versions"]]})


class BenchError(RuntimeError):
    """The benchmark cannot start (a dirty workspace, an engine holding it); says what to do."""


# -- workspaces --------------------------------------------------------------------------------------
def clone_workspace(source: Path, dest: Path, edits: dict[str, Any], message: str) -> Workspace:
    """The committed state of `source` (its HEAD) as a fresh workspace at `dest`, with `edits`
    (dotted workspace.toml paths) committed on top."""
    repo = git.Repo.clone_from(str(source), str(dest), no_hardlinks=True)
    repo.git.remote("remove", "origin")
    return _commit_edits(Workspace(dest), edits, message)


def _commit_edits(workspace: Workspace, edits: dict[str, Any], message: str) -> Workspace:
    text = edit_toml(read_config(workspace.config_path), edits)
    workspace.config_path.write_text(text, encoding="utf-8")
    workspace.load_config()  # the edits must still validate
    repo = git.Repo(workspace.root)
    repo.index.add([CONFIG_FILE])
    repo.index.commit(message, author=ACTOR, committer=ACTOR)
    return workspace


def _arm_edits(config: WorkspaceConfig, settings: BenchSettings, seed: int) -> dict[str, Any]:
    edits: dict[str, Any] = {
        "recipe.seed": seed,
        "policy.warmup.seed": seed,
        "recipe.steps": settings.version_steps,
        "budget.max_train_steps": max(config.budget.max_train_steps, settings.budget_steps),
        # The step budget bounds the loops; a version trains at least one step.
        "budget.max_versions": max(config.budget.max_versions, settings.budget_steps),
        "gates.after_diagnosis": False,
        "gates.after_design": False,
        "gates.after_backtest": False,
        "gates.after_completion": False,
    }
    if settings.val_size is not None:
        edits["domain.val_size"] = settings.val_size
    if settings.test_size is not None and config.domain.name != "custom":
        edits["domain.test_size"] = settings.test_size
    if settings.warmup_steps is not None:
        edits["policy.warmup.steps"] = settings.warmup_steps
    return edits | _leak_edits(config, settings)


def _leak_edits(config: WorkspaceConfig, settings: BenchSettings) -> dict[str, Any]:
    """The benchmark's leak switch for a SWE workspace (nothing elsewhere, or with no leak rate)."""
    if settings.leak_rate > 0 and config.domain.name == "swe":
        return {"domain.leak_fix_in_history": True, "domain.leak_rate": settings.leak_rate}
    return {}


def _leaky_config(config: WorkspaceConfig, settings: BenchSettings) -> WorkspaceConfig | None:
    """The version's config with the benchmark's leak on (None where the benchmark has none)."""
    leak = {key.removeprefix("domain."): value for key, value in _leak_edits(config, settings).items()}
    return config.model_copy(update={"domain": config.domain.model_copy(update=leak)}) if leak else None


def approve_everything(gate: Gate) -> Answer:
    """The benchmark's person: says yes at every gate, forced ones too (the arms are autonomous)."""
    return Answer("approve", by="bench")


# -- measuring -----------------------------------------------------------------------------------------
def _cpu_seconds(store: Store | None = None) -> float:
    """User and system CPU of this process and its finished children, and with `store` of every
    run worker that store knows and that has ended: the engine forks workers from its fork
    server, not from this process, so each reports its own in its last event."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    workers = sum(worker_cpu_seconds(Path(d)) for (d,) in store.query("SELECT run_dir FROM runs")) if store else 0.0
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + workers


def clean_scores(store: Store, run_id: str) -> tuple[float | None, float | None, float | None, int]:
    """(greedy, sampled, 95% half-width of sampled, tasks) of a run's last evaluation, on split
    ``clean`` when it has one (a leaky environment), else ``val`` (then val is clean)."""
    s = split_scores(store, run_id, clean_split(store, run_id))
    return s.greedy, s.sampled, s.halfwidth, s.n_tasks


def version_rows(engine: Engine) -> list[VersionRow]:
    """Every version of an arm's store in creation order, with what the arm saw and the clean truth."""
    out = []
    rows = engine.store.query(
        """
        SELECT v.name, v.parent, v.state, coalesce(v.decision_reason, ''), v.val_greedy, i.template, i.change
        FROM versions v LEFT JOIN interventions i ON i.id = v.intervention_id
        ORDER BY v.created_at, v.name
        """
    )
    for name, parent, state, reason, seen, template, change in rows:
        ev = engine.eval_run(name)
        clean = clean_scores(engine.store, ev.id) if ev else (None, None, None, 0)
        train = engine.train_run(name)
        steps, reward, correct = 0, None, None
        if train is not None:
            tail = engine.store.query_one(
                """
                WITH t AS (SELECT * FROM rollouts WHERE run_id = $run AND split = 'train')
                SELECT max(step), avg(reward) FILTER (WHERE step > 0.75 * (SELECT max(step) FROM t)),
                       avg(coalesce(reward_components['correctness'], reward))
                           FILTER (WHERE step > 0.75 * (SELECT max(step) FROM t))
                FROM t
                """,
                {"run": train.id},
            )
            last, reward, correct = tail or (None, None, None)  # an aggregate: one row, even without rollouts
            steps = int(last or 0)
        diagnosis = engine.store.query_one(
            "SELECT rules FROM diagnoses WHERE version = ? ORDER BY created_at DESC LIMIT 1", [name]
        )
        fired = json.loads(diagnosis[0]) if diagnosis else []
        rules = [r["rule"] for r in fired]
        blocking = [r["rule"] for r in fired if is_blocking(r["rule"], r["severity"])]
        changes = json.loads(change) if isinstance(change, str) else (change or {})
        text = ", ".join(f"{k} {v.get('from')!r} -> {v.get('to')!r}" for k, v in changes.items())
        unchanged = {CONTROL: "control (no change)", CONTINUE: "continued (no change)"}
        text = text or unchanged.get(template or "", "(base)")
        out.append(
            VersionRow(
                name,
                parent,
                text,
                template,
                steps,
                state,
                reason,
                seen,
                clean[0],
                clean[1],
                reward,
                correct,
                rules,
                blocking=blocking,
            )
        )
    return out


# -- the arms ------------------------------------------------------------------------------------------
def _hand_config_text(engine: Engine, settings: BenchSettings) -> str:
    edits = {f"recipe.{key}": value for key, value in settings.hand_recipe.items()}
    return edit_toml(engine.config_text(BASE), {**edits, "recipe.steps": settings.budget_steps})


def run_hand(engine: Engine, settings: BenchSettings, progress: ProgressFn | None) -> tuple[str, str | None]:
    text = _hand_config_text(engine, settings)
    config = parse_config(text, Path(f"{BASE}+hand_recipe:{CONFIG_FILE}"), engine.workspace.root)
    plan = VersionPlan(
        parent=BASE,
        name="v1",
        files={CONFIG_FILE: text},
        kind="optimizer",
        factor="hand recipe",
        change=config_changes(engine.version_config(BASE), config),
        hypothesis="The hand-made recipe, trained for the whole budget.",
        success_criterion="none: the benchmark's reference arm",
        rollback="none",
        template="hand_recipe",
    )
    engine.create_version(plan)
    engine.train("v1", progress)
    verdict = engine.judge("v1")
    decision = {"improved": "promoted", "regressed": "rejected"}.get(verdict.label, "pruned")
    engine.decide("v1", decision, f"hand recipe: {verdict.summary()}")
    return "v1", None


def run_loop(
    engine: Engine,
    arm: str,
    seed: int,
    settings: BenchSettings,
    say: Say,
    progress: ProgressFn | None,
    cpu_of: dict[str, float],
) -> tuple[str, str | None]:
    """Coach rounds until the arm's versions used the budget, spent as the coach's schedule plans
    (screen short, continue the winner longer); the arm's answer is its best promoted version.
    Each version is charged the CPU spent since the previous run ended: its round's diagnosis and
    proposal, its run and evaluation, and the diagnosis of that run."""

    def on_event(event: CoachEvent) -> None:
        if event.kind in ("proposal", "verdict", "decision", "refused", "skill", "evolution", "escalation"):
            say(f"    {event.message}")

    mark = [_cpu_seconds(engine.store)]

    def charge(update: RunUpdate) -> None:
        if update.kind == "train" and update.state != "running":
            now = _cpu_seconds(engine.store)
            cpu_of[update.version] = now - mark[0]
            mark[0] = now
        if progress is not None:
            progress(update)

    backend = RandomPlanner(seed) if arm == "random" else None
    harness = "score-only" if arm == "score-only" else "full"
    coach = Coach(engine, backend=backend, answer=approve_everything, on_event=on_event, harness=harness)
    stopped = None
    while (used := steps_spent(engine.store)) < settings.budget_steps:
        result = coach.run(engine.config.budget.max_versions, charge, steps=settings.budget_steps - used)
        if not result.trained:
            stopped = result.stopped or "the coach trained nothing more"
            break
    best = engine.best_version()
    assert best is not None
    return best.name, stopped


def run_arm(
    arm: str,
    workspace: Workspace,
    seed: int,
    settings: BenchSettings,
    say: Say,
    progress: ProgressFn | None = None,
) -> ArmResult:
    cpu_of: dict[str, float] = {}
    with Engine(workspace) as engine:
        cpu, wall = _cpu_seconds(engine.store), time.perf_counter()
        if arm == "base":
            final, stopped = BASE, None
        elif arm == "hand":
            final, stopped = run_hand(engine, settings, progress)
        else:
            final, stopped = run_loop(engine, arm, seed, settings, say, progress, cpu_of)
        cpu, wall = _cpu_seconds(engine.store) - cpu, time.perf_counter() - wall
        if arm == "hand":
            cpu_of["v1"] = cpu
        if arm in ("hand", "score-only"):
            # The benchmark's own audit: the full harness over versions the arm judged without it.
            for v in engine.store.list_versions():
                if v.parent is not None and engine.train_run(v.name) is not None:
                    engine.diagnose_version(v.name)
        rows = version_rows(engine)
        for r in rows:
            r.cpu_seconds = cpu_of.get(r.name)
        ev = engine.eval_run(final)
        greedy, sampled, halfwidth, _ = clean_scores(engine.store, ev.id) if ev else (None, None, None, 0)
        seen = next((r.seen_greedy for r in rows if r.name == final), None)
        # The report reads test: the final version, and the promoted lineage (when it reached a score).
        # With the leak on, the final version plays test in the arms' leaky environment as well
        # (split test_leaky; its clean test is the same either way), even when its own config
        # closed the leak: the leak finding compares what copying adds to each arm's final policy.
        tested = {}
        for r in rows:
            if r.name == final or (r.decision == "promoted" and r.parent is not None):
                leaky = _leaky_config(engine.version_config(r.name), settings) if r.name == final else None
                run, scores = _test_evaluation(engine, r.name, leaky)
                tested[r.name] = (run.id, scores)
                r.test_sampled = scores.sampled
                by_task = per_task_correctness(engine.store, run.id, "sampled", "test")
                r.test_per_task = {task: value for (task, _), value in by_task.items()}
        final_run, final_scores = tested[final]
        per_task = per_task_correctness(engine.store, final_run, "sampled", "test")
        leaky = per_task_correctness(engine.store, final_run, "sampled", "test_leaky")
    return ArmResult(
        arm=arm,
        seed=seed,
        workspace=str(workspace.root),
        final=final,
        clean_greedy=greedy,
        clean_sampled=sampled,
        clean_halfwidth=halfwidth,
        seen_greedy=seen,
        steps=sum(r.steps for r in rows),
        cpu_seconds=cpu,
        wall_seconds=wall,
        versions=rows,
        stopped=stopped,
        test_greedy=final_scores.greedy,
        test_sampled=final_scores.sampled,
        test_halfwidth=final_scores.halfwidth,
        test_per_task={task: value for (task, _), value in per_task.items()},
        test_leaky_per_task={task: value for (task, _), value in leaky.items()},
    )


def _test_evaluation(engine: Engine, version: str, leaky: WorkspaceConfig | None) -> tuple[RunRecord, Scores]:
    """The version's evaluation on test (and, with `leaky`, on test_leaky): v0's was made once in
    the seed's base clone, before the arms were copied from it (`run_seed`), and is read from there;
    any other version is evaluated here."""
    splits = ("test", "test_leaky") if leaky is not None else ("test",)
    if version == BASE:
        row = engine.store.query_one(
            """SELECT r.id FROM runs r WHERE r.version = ? AND r.kind = 'eval' AND r.state = 'succeeded'
               AND (SELECT count(DISTINCT o.split) FROM rollouts o
                    WHERE o.run_id = r.id AND list_contains(?, o.split)) = ?
               ORDER BY r.ended_at DESC LIMIT 1""",
            [version, list(splits), len(splits)],
        )
        if row is not None:
            run = engine.store.get_run(row[0])
            assert run is not None
            return run, split_scores(engine.store, run.id, "test")
    return engine.evaluate(version, "test", config=leaky)


def transfer_skills(template: str, dest: Path, settings: BenchSettings, say: Say) -> list[Path]:
    """One round of the full loop on another domain's template, with that template's own version
    length and val set (shorter versions promoted nothing there); the skill cards it writes."""
    ws = init_workspace(dest, template)
    edits = _arm_edits(ws.load_config(), settings, settings.seeds[0])
    for own in ("recipe.steps", "domain.val_size", "domain.test_size", "policy.warmup.steps"):
        edits.pop(own, None)
    ws = _commit_edits(ws, edits, "bench settings")
    with Engine(ws) as engine:
        say(f"  transfer: one round of the full loop on template {template!r}")
        Coach(engine, answer=approve_everything, harness="full").run(engine.config.coach.branches)
    return sorted((ws.root / "skills").glob("*.md"))


def prepare_seed(
    source: Path, root: Path, seed: int, settings: BenchSettings, say: Say, skills: list[Path]
) -> ArmResult:
    """The seed's start: its clone of the workspace with v0 built and evaluated on test (once for
    every arm), the base arm read from it, and a copy of that clone for each training arm (with
    the skill cards offered to the loops). Returns the base arm."""
    config = Workspace.open(source).load_config()
    base = clone_workspace(source, root / "base", _arm_edits(config, settings, seed), f"bench seed {seed}")
    say(f"seed {seed}: building v0 in {base.root}")
    with Engine(base) as engine:
        cpu, wall = _cpu_seconds(engine.store), time.perf_counter()
        engine.ensure_base()
        # v0's test evaluation, once for every arm (each copies this clone): in the arms' leaky
        # environment too where the benchmark has one (the answer of an arm that promoted nothing).
        engine.evaluate(BASE, "test", config=_leaky_config(engine.version_config(BASE), settings))
        v0_cpu, v0_wall = _cpu_seconds(engine.store) - cpu, time.perf_counter() - wall
    say(f"seed {seed}: arm base")
    result = run_arm("base", base, seed, settings, say)
    result.cpu_seconds, result.wall_seconds = v0_cpu, v0_wall
    say(arm_summary(result))
    for arm in TRAINED:
        shutil.copytree(base.root, root / arm, symlinks=True)
        if skills:
            (root / arm / "skills").mkdir(exist_ok=True)
            for card in skills:
                shutil.copy(card, root / arm / "skills" / card.name)
    return result


def run_trained_arm(arm: str, root: Path, seed: int, settings: BenchSettings, say: Say) -> ArmResult:
    """One training arm of a seed, in the copy `prepare_seed` made for it."""
    say(f"seed {seed}: arm {arm}")
    result = run_arm(arm, Workspace(root / arm), seed, settings, say)
    say(arm_summary(result))
    return result


def run_seed(
    source: Path, root: Path, seed: int, settings: BenchSettings, say: Say, skills: list[Path]
) -> list[ArmResult]:
    """Every arm of a seed, one after the other, in this process."""
    results = [prepare_seed(source, root, seed, settings, say, skills)]
    return results + [run_trained_arm(arm, root, seed, settings, say) for arm in TRAINED]


def arm_summary(result: ArmResult) -> str:
    return (
        f"seed {result.seed}: {result.arm} -> {result.final}, test sampled {_pct(result.test_sampled)}, "
        f"{result.steps} steps, {result.cpu_seconds:.0f} CPU s"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


@dataclass
class BenchRun:
    bench_id: str
    root: Path
    settings: BenchSettings
    results: list[ArmResult]
    transfer: list[str]
    seconds: float


def run_bench(source: Path | str, settings: BenchSettings, say: Say = print) -> BenchRun:
    """Run every arm for every seed; the clones stay under `<ws>/.evotrainer/bench/<id>/`."""
    source = Workspace.open(source).root
    repo = git.Repo(source)
    if repo.is_dirty(path=CONFIG_FILE):
        raise BenchError(f"{source / CONFIG_FILE} has uncommitted changes; commit them: the benchmark clones HEAD")
    config = Workspace.open(source).load_config()
    if config.domain.name == "custom":
        has_test = bool(make_domain(config.domain, source).tasks("test"))
    else:
        has_test = bool(settings.test_size or getattr(config.domain, "test_size", 0))
    if not has_test:
        raise BenchError(
            "the benchmark scores every arm on a test split no arm decides on, and this workspace has none: set "
            "[domain] test_size (or [bench] test_size), or give a custom domain splits = ('train', 'val', 'test')"
        )
    bench_id = datetime.now().strftime("bench-%Y%m%d-%H%M%S")
    root = source / STATE_DIR / "bench" / bench_id
    root.mkdir(parents=True)
    started = time.perf_counter()
    skills: list[Path] = []
    if settings.transfer_from:
        skills = transfer_skills(settings.transfer_from, root / "transfer", settings, say)
        say(f"  transfer: {len(skills)} skill card(s) offered to the loops: {', '.join(p.stem for p in skills)}")
    from engine.bench.lanes import default_lanes, run_in_lanes

    lanes = settings.lanes or default_lanes()
    settings = replace(settings, lanes=lanes)  # what ran, for results.json
    if lanes > 1:
        results = run_in_lanes(source, root, settings, skills, lanes, say)
    else:
        results = []
        for seed in settings.seeds:
            results += run_seed(source, root / f"seed{seed}", seed, settings, say, skills)
    return BenchRun(bench_id, root, settings, results, [p.stem for p in skills], time.perf_counter() - started)
