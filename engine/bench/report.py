"""The benchmark's findings, from the arms' stores, and its report: Markdown with a table, a PNG
plot per arm, and the same plots for a terminal; where each arm spent its steps (the share in its
answer's lineage) and one figure of every arm's test score against the steps it spent.

Scores are on test, which no arm decided on: a score chosen on val and reported on val carries a
winner's-curse bias. Every finding is computed, never asserted: each says what was looked for,
what the stores show, and per seed whether it holds, fails, or was not observed (a result like
any other); each can come out "fails" on a real run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.bench.arms import ARMS, ArmResult, BenchRun, VersionRow
from engine.grpo import DEAD_STD
from engine.store import Store
from engine.verdict import paired_bootstrap
from engine.workspace import Workspace

#: A collapse: one-step submissions in at least this share of the last quarter's rollouts and at
#: least twice the share of the first quarter's.
COLLAPSE_SHARE = 0.3
#: The arms the full loop must beat for the main finding: the ablation and random search.
BASELINES = ("score-only", "random")


@dataclass
class BenchFinding:
    name: str
    title: str
    holds: dict[int, bool | None] = field(default_factory=dict)  # seed -> holds (None: not applicable)
    lines: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        values = [v for v in self.holds.values() if v is not None]
        missing = len(self.holds) - len(values)
        unseen = f"; not observed on {missing}" if missing else ""
        if not values:
            return "not observed"
        if all(values):
            return f"holds on every seed observed ({len(values)}){unseen}"
        return f"holds on {sum(values)} of {len(values)} seeds, fails on {len(values) - sum(values)}{unseen}"


def _query(result: ArmResult, sql: str, params: list[Any] | dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Rows of `sql` over an arm's own store (opened for this query, then closed)."""
    store = Store(Workspace(Path(result.workspace)).db_path)
    try:
        return store.query(sql, params or [])
    finally:
        store.close()


def _by_seed(results: list[ArmResult]) -> dict[int, dict[str, ArmResult]]:
    out: dict[int, dict[str, ArmResult]] = {}
    for r in results:
        out.setdefault(r.seed, {})[r.arm] = r
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def paired(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, float, int] | None:
    """(mean of a - b, 95% low, high, tasks) over the test tasks both arms scored (paired bootstrap)."""
    tasks = sorted(a.keys() & b.keys())
    if not tasks:
        return None
    x, y = np.array([b[t] for t in tasks]), np.array([a[t] for t in tasks])
    low, high = paired_bootstrap(x, y)
    return float((y - x).mean()), low, high, len(tasks)


def _delta(d: tuple[float, float, float, int] | None) -> str:
    return "no common test task" if d is None else f"{d[0]:+.3f} (95% {d[1]:+.3f} to {d[2]:+.3f}, {d[3]} tasks)"


# -- findings --------------------------------------------------------------------------------------
def leak_gap(r: ArmResult) -> dict[str, float]:
    """Per test task, the final version's leaky minus clean score (sampled passes' mean): what
    copying the fix from the history adds; empty when the arm's environment had no leak."""
    tasks = r.test_per_task.keys() & r.test_leaky_per_task.keys()
    return {t: r.test_leaky_per_task[t] - r.test_per_task[t] for t in tasks}


def leak_finding(results: list[ArmResult]) -> BenchFinding:
    """On outcomes: an arm's final version learned the leak when its leaky-minus-clean gap on test
    exceeds v0's (a paired 95% interval over test tasks above 0). Holds when another arm's final
    version learned it and the full loop's did not; fails when the full loop's did; not observed
    when none did (or the environment had no leak). The versions that fired the `leak` rule on val,
    and what each arm decided about them, are listed beside it."""
    f = BenchFinding("leak", "The leak: high scores copied from history, caught by the full loop")
    for seed, arms in _by_seed(results).items():
        for arm, r in arms.items():
            for v in (v for v in r.versions if "leak" in v.rules):
                f.lines.append(
                    f"seed {seed}, {arm}: {v.name} ({v.change}) fires `leak`; val as seen {_fmt(v.seen_greedy)}, "
                    f"clean {_fmt(v.clean_greedy)}; {v.decision}: {v.reason}"
                )
        gaps = {a: leak_gap(r) for a, r in arms.items()}
        if "base" not in arms or not gaps["base"]:
            f.holds[seed] = None
            f.lines.append(f"seed {seed}: not observed: no leaky test evaluation (the environment had no leak)")
            continue
        base = gaps["base"]
        learned = {}
        for a, gap in gaps.items():
            if a == "base" or not gap:
                continue
            d = paired(gap, base)
            learned[a] = d is not None and d[1] > 0
            mean = float(np.mean(list(gap.values())))
            f.lines.append(
                f"seed {seed}, {a}: final {arms[a].final} leaky - clean on test {mean:+.3f}, against v0's "
                f"{float(np.mean(list(base.values()))):+.3f}: {_delta(d)}"
                + ("; it learned the leak" if learned[a] else "")
            )
        others = [a for a, yes in learned.items() if yes and a != "full"]
        if learned.get("full"):
            f.holds[seed] = False
        elif "full" in learned and others:
            f.holds[seed] = True
        else:
            f.holds[seed] = None
            f.lines.append(f"seed {seed}: not observed: no other arm's final version copies beyond v0's")
    return f


#: (arm, version) -> one-step share in the first and last quarter, distinct share in the same.
ShareFn = Callable[[ArmResult, str], tuple[float | None, float | None, float | None, float | None]]


def _one_step_share(r: ArmResult, version: str) -> tuple[float | None, float | None, float | None, float | None]:
    """(first-quarter, last-quarter) share of the version's train rollouts that submitted in one
    turn, and the same quarters' share of distinct completions within a group."""
    rows = _query(
        r,
        """
        WITH t AS (SELECT o.* FROM rollouts o JOIN runs x ON x.id = o.run_id
                   WHERE x.version = ? AND x.kind = 'train' AND o.split = 'train'),
        q AS (SELECT *, CASE WHEN step <= 0.25 * (SELECT max(step) FROM t) THEN 'first'
                             WHEN step > 0.75 * (SELECT max(step) FROM t) THEN 'last' END AS quarter FROM t),
        g AS (SELECT quarter, count(DISTINCT completion) / count(*) AS distinct_share
              FROM q WHERE quarter IS NOT NULL GROUP BY quarter, step, group_id)
        SELECT avg((num_turns <= 1)::INT) FILTER (WHERE quarter = 'first'),
               avg((num_turns <= 1)::INT) FILTER (WHERE quarter = 'last'),
               (SELECT avg(distinct_share) FROM g WHERE quarter = 'first'),
               (SELECT avg(distinct_share) FROM g WHERE quarter = 'last')
        FROM q
        """,
        [version],
    )
    return rows[0] if rows else (None, None, None, None)  # type: ignore[return-value]


def efficiency_finding(results: list[ArmResult], shares: ShareFn | None = None) -> BenchFinding:
    """Holds when every branch of the full loop that added the efficiency reward and collapsed
    (the guard stopped it, or its one-step share reached COLLAPSE_SHARE and doubled) was kept
    out (rejected or pruned); fails when the full loop promoted one; not observed when none of its
    branches collapsed. `shares` reads the quarters' shares (default: the arm's store)."""
    shares = shares or _one_step_share
    f = BenchFinding("efficiency", "The efficiency reward: collapse into one-step submissions, rejected")
    for seed, arms in _by_seed(results).items():
        kept_out: list[bool] = []
        seen = False
        for arm, r in arms.items():
            for v in r.versions:
                if v.template != "efficiency_reward":
                    continue
                seen = True
                first, last, d_first, d_last = shares(r, v.name)
                stopped = "stopped_early" in v.rules
                collapsed = stopped or last is not None and last >= COLLAPSE_SHARE and last >= 2 * (first or 0)
                f.lines.append(
                    f"seed {seed}, {arm}: {v.name} adds the efficiency reward; one-step submissions "
                    f"{_fmt(first, 2)} -> {_fmt(last, 2)} of train rollouts, distinct completions per group "
                    f"{_fmt(d_first, 2)} -> {_fmt(d_last, 2)}; clean {_fmt(v.clean_greedy)}; rules "
                    f"{', '.join(v.rules) or 'none'}; {v.decision} after {v.steps} steps"
                    + (" (the collapse guard stopped it early)" if stopped else "")
                    + ("" if collapsed else " (no collapse by this measure)")
                )
                if arm == "full" and collapsed:
                    kept_out.append(v.decision != "promoted")
        f.holds[seed] = all(kept_out) if kept_out else None
        if not kept_out:
            tried = "no branch of the full loop collapsed" if seen else "no arm proposed the efficiency reward"
            f.lines.append(f"seed {seed}: not observed: {tried}")
    return f


def backtest_finding(results: list[ArmResult]) -> BenchFinding:
    f = BenchFinding("backtest", "A backtest that predicted a dead-group revival, and the run that tested it")
    for seed, arms in _by_seed(results).items():
        r = arms.get("full")
        if r is None:
            continue
        rows = _query(
            r,
            """
                WITH p AS (SELECT unnest(CAST(proposals AS JSON[])) AS p FROM rounds),
                b AS (SELECT p ->> 'version' AS version, p -> 'backtest' ->> 'id' AS bt FROM p
                      WHERE p -> 'backtest' ->> 'id' IS NOT NULL)
                SELECT b.version, t.kind, t.run_id, t.result ->> 'dead_before', t.result ->> 'dead_after',
                       t.result ->> 'revived',
                       (SELECT avg(d) FROM (SELECT (max(group_std) < $dead)::INT AS d FROM rollouts o
                        JOIN runs x ON x.id = o.run_id
                        WHERE x.version = b.version AND x.kind = 'train' AND o.split = 'train'
                        GROUP BY o.run_id, o.step, o.group_id))
                FROM b JOIN backtests t ON t.id = b.bt
                """,
            {"dead": DEAD_STD},
        )
        tested = []
        for version, kind, run_id, before, after, revived, child_dead in rows:
            before = float(before) if before is not None else None
            predicted = revived is not None and float(revived) > 0
            if version is None or child_dead is None or before is None:
                f.lines.append(f"seed {seed}: {kind} backtest on {run_id} predicted revival {revived}; no run followed")
                continue
            confirmed = child_dead < before
            tested.append(predicted and confirmed if predicted else None)
            f.lines.append(
                f"seed {seed}: {kind} backtest on {run_id}: dead groups {_fmt(before, 2)} -> {_fmt(float(after), 2)}"
                f" predicted ({_fmt(float(revived) if revived else 0.0, 2)} revived); {version}'s run had "
                f"{_fmt(child_dead, 2)} dead: {'confirmed' if confirmed else 'refuted'}"
            )
        predicted_runs = [t for t in tested if t is not None]
        f.holds[seed] = any(predicted_runs) if predicted_runs else None
        if not rows:
            f.lines.append(f"seed {seed}: the full loop ran no reward or filter backtest")
    return f


def transfer_finding(results: list[ArmResult], domain: str, offered: list[str]) -> BenchFinding:
    f = BenchFinding("transfer", "Skill transfer: a skill learned in one domain retrieved and adapted in another")
    if not offered:
        f.lines.append("no skill from another domain was offered (set [bench] transfer_from; not in --quick)")
        return f
    for seed, arms in _by_seed(results).items():
        r = arms.get("full")
        if r is None:
            continue
        rows = _query(
            r,
            """SELECT v.name, i.source, i.change, v.state FROM interventions i JOIN versions v ON v.name = i.version
               WHERE i.source LIKE 'skill:%' ORDER BY v.created_at""",
        )
        used = [(n, s.split(":", 1)[1], c, st) for n, s, c, st in rows if s.split(":", 1)[1] in offered]
        for name, card, change, state in used:
            f.lines.append(
                f"seed {seed}: {name} applied skill `{card}` (learned outside {domain}) as {change}: {state}"
            )
        f.holds[seed] = bool(used)
        if not used:
            f.lines.append(f"seed {seed}: the full loop retrieved none of the offered cards ({', '.join(offered)})")
    return f


#: The compute target: the full loop reaches the hand recipe's score on at most this share of its steps.
COMPUTE_SHARE = 0.67


def compute_finding(results: list[ArmResult]) -> BenchFinding:
    """Holds when a promoted version of the full loop reached the hand recipe's test score within
    COMPUTE_SHARE of the hand recipe's GRPO steps (all versions trained until then count). Reached
    means level with the hand recipe or above: the paired 95% interval of the difference on test
    does not lie wholly below 0 (as in the hand finding)."""
    f = BenchFinding(
        "compute", f"Compute: the full loop reaches the hand recipe's test score within {COMPUTE_SHARE}x its steps"
    )
    for seed, arms in _by_seed(results).items():
        full, hand = arms.get("full"), arms.get("hand")
        if full is None or hand is None or hand.test_sampled is None:
            continue
        steps = cpu = 0.0
        reached, gap = None, None
        for v in full.versions:
            if v.parent is None:
                continue
            steps += v.steps
            cpu += v.cpu_seconds or 0.0
            d = paired(v.test_per_task, hand.test_per_task) if v.test_per_task else None
            if d is not None and d[2] >= 0:
                reached, gap = v, d
                break
        if reached is None:
            f.holds[seed] = False
            f.lines.append(
                f"seed {seed}: no promoted version of the full loop reached the hand recipe's test sampled "
                f"{_fmt(hand.test_sampled)} ({full.steps} steps, {full.cpu_seconds:.0f} CPU s used; hand: "
                f"{hand.steps} steps, {hand.cpu_seconds:.0f} CPU s)"
            )
        else:
            f.holds[seed] = steps <= COMPUTE_SHARE * hand.steps
            f.lines.append(
                f"seed {seed}: {reached.name} reached test sampled {_fmt(reached.test_sampled)} against hand "
                f"{_fmt(hand.test_sampled)} ({_delta(gap)}) after {steps:.0f} steps ({steps / max(hand.steps, 1):.2f}x "
                f"the hand recipe's {hand.steps}) and {cpu:.0f} CPU s (hand: {hand.cpu_seconds:.0f})"
            )
    return f


def _beats_baselines(results: list[ArmResult], candidate: str, f: BenchFinding) -> BenchFinding:
    """Fills `f`: per seed, whether `candidate`'s final version beats both baselines, score-only and
    random search, on test beyond the floor (each paired 95% interval of the difference above 0).
    A seed without the candidate or either baseline arm is not observed."""
    for seed, arms in _by_seed(results).items():
        arm = arms.get(candidate)
        baselines = [a for a in BASELINES if a in arms]
        if arm is None or not baselines:
            continue
        deltas = {a: paired(arm.test_per_task, arms[a].test_per_task) for a in baselines}
        f.holds[seed] = all(d is not None and d[1] > 0 for d in deltas.values())
        others = [a for a in ("hand", "base") if a in arms and a != candidate]
        against = {a: _delta(paired(arm.test_per_task, arms[a].test_per_task)) for a in others}
        f.lines.append(
            f"seed {seed}: {candidate} {arm.final} {_fmt(arm.test_sampled)}"
            + "".join(f"; vs {a} {arms[a].final} {_fmt(arms[a].test_sampled)}: {_delta(d)}" for a, d in deltas.items())
            + "".join(f"; vs {a}: {text}" for a, text in against.items())
        )
    return f


def main_finding(results: list[ArmResult]) -> BenchFinding:
    """Holds when the full loop's final version beats both baselines, score-only and random
    search, on test beyond the floor (each paired 95% interval of the difference above 0); fails
    otherwise. A seed without either baseline arm is not observed."""
    title = "Main result: the full loop against score-only and random search on test, beyond the floor"
    return _beats_baselines(results, "full", BenchFinding("main", title))


def reach_finding(results: list[ArmResult]) -> BenchFinding:
    """The main result's positive control: the same test with the hand recipe in the full loop's
    place. Where it fails, the test split cannot tell the reference recipe from the baselines on
    that seed, so a failing main result there says as much about the benchmark's power as about
    the loop."""
    title = "The main result's reach: the hand recipe against score-only and random search on test, beyond the floor"
    return _beats_baselines(results, "hand", BenchFinding("reach", title))


def rl_pays_finding(results: list[ArmResult]) -> BenchFinding:
    """Holds when the hand recipe trained from v0 gains on test beyond the floor."""
    f = BenchFinding("rl_pays", "RL pays: the hand recipe against v0 on test, beyond the floor")
    for seed, arms in _by_seed(results).items():
        hand, base = arms.get("hand"), arms.get("base")
        if hand is None or base is None:
            continue
        d = paired(hand.test_per_task, base.test_per_task)
        f.holds[seed] = d is not None and d[1] > 0
        f.lines.append(
            f"seed {seed}: hand {_fmt(hand.test_sampled)} vs v0 {_fmt(base.test_sampled)} after {hand.steps} "
            f"steps: {_delta(d)}"
        )
    return f


def hand_finding(results: list[ArmResult]) -> BenchFinding:
    """Holds when the full loop's final version is at least the hand recipe on test: the paired 95%
    interval of the difference does not lie wholly below 0; fails when it does."""
    f = BenchFinding("hand", "The full loop at least matches the hand recipe on test (paired interval not below 0)")
    for seed, arms in _by_seed(results).items():
        full, hand = arms.get("full"), arms.get("hand")
        if full is None or hand is None:
            continue
        d = paired(full.test_per_task, hand.test_per_task)
        f.holds[seed] = d is not None and d[2] >= 0
        f.lines.append(f"seed {seed}: full {_fmt(full.test_sampled)} vs hand {_fmt(hand.test_sampled)}: {_delta(d)}")
    return f


def findings(run: BenchRun, domain: str) -> list[BenchFinding]:
    r = run.results
    return [
        main_finding(r),
        reach_finding(r),
        rl_pays_finding(r),
        hand_finding(r),
        leak_finding(r),
        efficiency_finding(r),
        backtest_finding(r),
        transfer_finding(r, domain, run.transfer),
        compute_finding(r),
    ]


# -- where the steps went ---------------------------------------------------------------------------
def lineage(result: ArmResult) -> list[VersionRow]:
    """The arm's answer and its ancestors, oldest first: the versions whose training the answer
    carries (a continuation resumes its parent's training, so a lineage is one run in segments).
    The chain stops at a version whose parent is not among the arm's rows (it cannot be counted,
    and no step is invented for it); empty when the answer itself is not among them."""
    by_name = {v.name: v for v in result.versions}
    chain: list[VersionRow] = []
    name: str | None = result.final
    while name is not None and name in by_name and all(v.name != name for v in chain):
        chain.append(by_name[name])
        name = by_name[name].parent
    return chain[::-1]


def lineage_steps(result: ArmResult) -> tuple[int, int]:
    """(GRPO steps in the answer's lineage, all the steps the arm spent): how much of the budget
    the answer was trained with. A loop spends the rest on siblings that lost (screens, controls,
    rejected continuations); the hand recipe spends all of it in its one version; v0 trains none.
    Measured because a loop's answer can carry a small share of the steps it was charged with, so
    a loop and the hand recipe at "the same budget" need not have trained their answers equally."""
    return sum(v.steps for v in lineage(result)), result.steps


def _share(part: float, whole: float) -> str:
    return f"{part:.0f}/{whole:.0f} ({part / whole:.0%})" if whole else "-"


def lineage_cell(results: list[ArmResult]) -> str:
    """One arm's lineage steps over seeds, for the main table: the mean over seeds of the steps in
    its answer's lineage against the mean it spent, and their ratio (the share of all its steps
    over seeds, so the percentage is the fraction shown); "-" for an arm that trained nothing."""
    pairs = [lineage_steps(r) for r in results]
    return _share(statistics.mean(p[0] for p in pairs), statistics.mean(p[1] for p in pairs)) if pairs else "-"


def lineage_lines(results: list[ArmResult]) -> list[str]:
    """Per seed and arm: the answer's lineage with each version's steps, its share of the arm's
    steps, and how many steps went into versions outside it."""
    lines = []
    for seed, arms in _by_seed(results).items():
        for arm, r in arms.items():
            chain = lineage(r)
            inside, spent = lineage_steps(r)
            if not chain:
                lines.append(f"seed {seed}, {arm}: its answer {r.final} is not among its versions; {spent} steps spent")
                continue
            path = " -> ".join(v.name if v.parent is None else f"{v.name} ({v.steps})" for v in chain)
            names = {v.name for v in chain}
            outside = [v for v in r.versions if v.parent is not None and v.name not in names]
            line = f"seed {seed}, {arm}: {path}, " + (
                f"{inside} of {spent} steps ({inside / spent:.0%}); {spent - inside} in {len(outside)} other version(s)"
                if spent
                else "no GRPO step spent"
            )
            if chain[0].parent is not None:
                line += (
                    f" ({chain[0].name}'s parent {chain[0].parent} is not among the arm's versions:"
                    f" the lineage is counted from {chain[0].name})"
                )
            lines.append(line)
    return lines


@dataclass(frozen=True)
class StepsCurve:
    """One arm's answer in one seed as its steps were spent: (cumulative GRPO steps of the arm when
    the version was trained, test sampled score) for v0 (at 0) and each version of the answer's
    lineage that was tested, in creation order; `spent` is all the arm's steps, where its answer
    stands when the budget is gone."""

    arm: str
    seed: int
    points: list[tuple[int, float]]
    spent: int


def steps_curves(results: list[ArmResult]) -> list[StepsCurve]:
    """Test score against steps spent, per seed and arm. The steps are cumulative over every
    version the arm trained, siblings included (what it cost to reach that version, as the compute
    finding counts them), not the lineage's own. Only the lineage is scored on test: the report's
    evaluations cover the answer and its promoted ancestors. v0's score is the arm's own test of
    v0 when it has one (its answer is v0), else the base arm's of the same seed (the same
    checkpoint; every arm starts from it)."""
    curves = []
    for seed, arms in _by_seed(results).items():
        base = arms.get("base")
        for arm, r in arms.items():
            chain = {v.name for v in lineage(r)}
            points: list[tuple[int, float]] = []
            spent = 0
            for v in r.versions:
                spent += v.steps
                score = r.test_sampled if v.name == r.final else v.test_sampled
                if v.parent is None:
                    if score is None and base is not None:
                        score = base.test_sampled
                    if score is not None:
                        points.append((0, score))
                elif v.name in chain and score is not None:
                    points.append((spent, score))
            curves.append(StepsCurve(arm, seed, points, r.steps))
    return curves


def plot_steps_png(results: list[ArmResult], path: Path) -> Path:
    """All arms in one figure, a panel per seed: each arm's answer's test score against the steps
    it had spent, dotted on to all it spent; the base arm (v0) as a horizontal line to read
    gains from."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = steps_curves(results)
    seeds = list(dict.fromkeys(c.seed for c in curves))
    order = list(dict.fromkeys([*ARMS, *(c.arm for c in curves)]))
    colors = {arm: f"C{i}" for i, arm in enumerate(order)}
    fig, axes = plt.subplots(1, len(seeds), figsize=(4.8 * len(seeds) + 1.6, 3.8), dpi=100, squeeze=False)
    for ax, seed in zip(axes[0], seeds, strict=True):
        for c in (c for c in curves if c.seed == seed and c.points):
            xs, ys = [p[0] for p in c.points], [p[1] for p in c.points]
            if c.arm == "base":
                ax.axhline(ys[-1], color=colors[c.arm], linestyle="--", linewidth=1, label="base (v0)")
                continue
            ax.plot(xs, ys, "o-", color=colors[c.arm], label=c.arm)
            if c.spent > xs[-1]:
                ax.plot([xs[-1], c.spent], [ys[-1], ys[-1]], ":", color=colors[c.arm])
        ax.set_title(f"seed {seed}")
        ax.set_xlabel("GRPO steps spent by the arm")
    axes[0][0].set_ylabel("test sampled (answer's lineage)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Test score against steps spent (dotted: steps spent after the answer was trained)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# -- the table and the plots ------------------------------------------------------------------------
def _mean_sd(values: Iterable[float | None]) -> str:
    xs = [x for x in values if x is not None]
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.3f}" + (f" ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else "")


def main_table(results: list[ArmResult]) -> list[list[str]]:
    """Rows per arm over seeds: test greedy (mean ± sd over seeds), test sampled with its noise
    floor, val as the arm saw it, versions, steps, the steps in the answer's lineage, CPU seconds,
    decisions."""
    rows = [
        [
            "arm",
            "test greedy",
            "test sampled (±95%)",
            "val as seen",
            "versions",
            "GRPO steps",
            "lineage steps",
            "CPU s",
            "decisions (all seeds)",
        ]
    ]
    for arm in dict.fromkeys(r.arm for r in results):
        rs = [r for r in results if r.arm == arm]
        decisions: dict[str, int] = {}
        for r in rs:
            for v in r.versions:
                if v.parent is not None:
                    decisions[v.decision] = decisions.get(v.decision, 0) + 1
        sampled = statistics.mean([r.test_sampled for r in rs if r.test_sampled is not None] or [float("nan")])
        floor = statistics.mean([r.test_halfwidth for r in rs if r.test_halfwidth is not None] or [float("nan")])
        rows.append(
            [
                arm,
                _mean_sd(r.test_greedy for r in rs),
                f"{sampled:.3f} ± {floor:.3f}",
                _mean_sd(r.seen_greedy for r in rs),
                f"{statistics.mean(sum(v.parent is not None for v in r.versions) for r in rs):.3g}",
                f"{statistics.mean(r.steps for r in rs):.0f}",
                lineage_cell(rs),
                f"{statistics.mean(r.cpu_seconds for r in rs):.0f}",
                ", ".join(f"{n} {k}" for k, n in sorted(decisions.items())) or "-",
            ]
        )
    return rows


def _series(r: ArmResult) -> tuple[list[str], list[float | None], list[float | None], list[float | None]]:
    versions = r.versions
    return (
        [v.name for v in versions],
        [v.train_reward for v in versions],
        [v.seen_greedy for v in versions],
        [v.clean_greedy for v in versions],
    )


def _range(results: list[ArmResult], arm: str) -> tuple[float, float]:
    """The plots' y range: 0 to 1, widened to the rewards (penalties make them negative, and a
    weighted sum of several components can pass 1); plotext fails on a point outside its range."""
    values = [v.train_reward for r in results if r.arm == arm for v in r.versions if v.train_reward is not None]
    return min([0.0, *values]), max([1.0, *values])


def plot_png(results: list[ArmResult], arm: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for r in (r for r in results if r.arm == arm):
        names, reward, seen, clean = _series(r)
        x = list(range(len(names)))
        ax.plot(x, [float("nan") if y is None else y for y in reward], "o-", label=f"train reward (seed {r.seed})")
        ax.plot(x, [float("nan") if y is None else y for y in seen], "s--", label=f"val as seen (seed {r.seed})")
        ax.plot(x, [float("nan") if y is None else y for y in clean], "^-", label=f"clean greedy (seed {r.seed})")
        ax.set_xticks(x, names)
    ax.set_title(f"{arm}: reward and clean score over versions")
    ax.set_xlabel("version (creation order)")
    low, high = _range(results, arm)
    ax.set_ylim(low - 0.05, high + 0.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_terminal(results: list[ArmResult], arm: str, width: int = 72, height: int = 14) -> str:
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    for r in (r for r in results if r.arm == arm):
        names, reward, _, clean = _series(r)
        x = list(range(len(names)))
        plt.xticks(x, names)
        for label, ys in ((f"reward s{r.seed}", reward), (f"clean s{r.seed}", clean)):
            pts = [(i, y) for i, y in zip(x, ys, strict=True) if y is not None]
            if pts:
                plt.plot([p[0] for p in pts], [p[1] for p in pts], label=label, marker="dot")
    plt.title(f"{arm}: reward and clean score over versions")
    plt.ylim(*_range(results, arm))
    return str(plt.build())


def _markdown_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def render(
    run: BenchRun, domain: str, found: list[BenchFinding], plots: dict[str, Path], steps_plot: Path | None = None
) -> str:
    s = run.settings
    out = [
        f"# Autonomy benchmark {run.bench_id}",
        "",
        f"Domain `{domain}`; seeds {', '.join(map(str, s.seeds))}; budget {s.budget_steps} GRPO steps per arm "
        f"(loop versions of {s.version_steps}); {'quick' if s.quick else 'full'} mode; "
        f"{run.seconds / 60:.1f} minutes in all. Scores are on the test split, which no arm decided on, in"
        " the clean environment"
        + (f" (the arms trained with the leak on {s.leak_rate:.0%} of tasks)" if s.leak_rate else "")
        + ". ± after a greedy score is its spread over seeds; after a sampled score, the 95% noise floor over"
        " test tasks. *lineage steps*: the GRPO steps in the answer's lineage (the final version and its"
        " ancestors) of all the arm spent, means over seeds.",
        "",
        _markdown_table(main_table(run.results)),
        "",
    ]
    for f in found:
        out += [f"## {f.title}", "", f"**{f.verdict()}**", ""]
        out += [f"- {line}" for line in f.lines] + [""]
    out += ["## Where the steps went", ""]
    out += [
        "The GRPO steps in each arm's answer's lineage (each version's own steps in parentheses) against all it"
        " spent; the rest went into versions outside the lineage (screens, controls, rejected branches).",
        "",
    ]
    out += [f"- {line}" for line in lineage_lines(run.results)] + [""]
    if steps_plot is not None:
        out += [
            "Test sampled score of each arm's answer's lineage against the steps the arm had spent when each"
            " version was trained (every version so far, siblings included); dotted: the steps spent after"
            " the answer; dashed: v0.",
            "",
            f"![test score against steps spent]({steps_plot.name})",
            "",
        ]
    out += ["## Versions", ""]
    rows = [
        ["seed", "arm", "version", "change", "steps", "reward", "val as seen", "val clean", "test", "rules", "decision"]
    ]
    for r in run.results:
        for v in r.versions:
            if v.parent is None and r.arm != "base":
                continue
            rows.append(
                [
                    str(r.seed),
                    r.arm,
                    v.name,
                    v.change.replace("|", "/"),
                    str(v.steps),
                    _fmt(v.train_reward),
                    _fmt(v.seen_greedy),
                    _fmt(v.clean_greedy),
                    _fmt(v.test_sampled),
                    ", ".join(v.rules) or "-",
                    v.decision,
                ]
            )
    out += [_markdown_table(rows), ""]
    out += ["## Plots", ""] + [f"![{arm}]({p.name})" for arm, p in plots.items()] + [""]
    return "\n".join(out)


def write_report(run: BenchRun, domain: str) -> tuple[Path, list[BenchFinding], dict[str, str]]:
    """report.md, one PNG per arm and steps.png (test score against steps spent, every arm) in the
    bench's folder; the terminal plots by arm."""
    found = findings(run, domain)
    arms = list(dict.fromkeys(r.arm for r in run.results))
    plots = {arm: plot_png(run.results, arm, run.root / f"{arm}.png") for arm in arms}
    steps_plot = plot_steps_png(run.results, run.root / "steps.png")
    path = run.root / "report.md"
    path.write_text(render(run, domain, found, plots, steps_plot), encoding="utf-8")
    (run.root / "results.json").write_text(
        json.dumps(
            {
                "bench_id": run.bench_id,
                "settings": run.settings.__dict__,
                "results": [r.to_dict() for r in run.results],
                "findings": [f.__dict__ for f in found],
            },
            indent=1,
            default=str,
        )
    )
    return path, found, {arm: plot_terminal(run.results, arm) for arm in arms}


def store_results(store: Store, run: BenchRun, found: list[BenchFinding], report: str) -> None:
    """The benchmark in the workspace's own store (`bench_results`, `bench_reports`)."""
    with store.transaction():
        for r in run.results:
            store.con.execute(
                "INSERT INTO bench_results (bench_id, seed, arm, final_version, clean_greedy, clean_sampled,"
                " clean_halfwidth, seen_greedy, versions, steps, cpu_seconds, wall_seconds, details, workspace,"
                " test_greedy, test_sampled, test_halfwidth)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    run.bench_id,
                    r.seed,
                    r.arm,
                    r.final,
                    r.clean_greedy,
                    r.clean_sampled,
                    r.clean_halfwidth,
                    r.seen_greedy,
                    sum(v.parent is not None for v in r.versions),
                    r.steps,
                    r.cpu_seconds,
                    r.wall_seconds,
                    json.dumps(r.to_dict(), default=str),
                    r.workspace,
                    r.test_greedy,
                    r.test_sampled,
                    r.test_halfwidth,
                ],
            )
        store.con.execute(
            "INSERT INTO bench_reports VALUES (?, ?, ?, ?, current_timestamp)",
            [
                run.bench_id,
                json.dumps(run.settings.__dict__, default=str),
                json.dumps([{"name": f.name, "verdict": f.verdict(), "lines": f.lines} for f in found]),
                report,
            ],
        )
