"""Version layer: has the form of this version's answers moved away from its parent's?

A score that jumps while the answers change their form is the classic signature of a verifier
being learned instead of the task (answers sprayed until one matches, a format the checker
accepts by mistake, a shortcut). These analyzers know nothing of the domain: they compare the
policy's own text (the completion, or a multi-turn episode's actions) in the sampled val passes
of the version's latest evaluation with its parent's, feature by feature, and count a shift only
when it is beyond the parent's own seed-to-seed spread (the same policy, sampled again) at a
stated false-alarm rate (`engine.harness.cutoffs`: no effect-size constant fitted to a domain),
and unexplained. A shift of every answer toward what the parent's *correct* answers already
looked like is explained: more answers take the form that was right (a chain no longer cut by
the length budget, a format check passed more often). A new form of the correct answers
themselves is never explained; they are compared on the tasks both versions solved, so a version
that solves new tasks (longer problems, once the budget allows) is not mistaken for one that
answers the old ones differently. The `form_shift` rule reads them.

Features (each a finding `version.shift.<feature>`):
- over every completion, each with the parent's correct completions as its reference: ratios of
  means `length` (characters) and `length_p90` (the tail); shares `distinct` (distinct
  completions) and `format` (the domain's `format` component passes, where it has one);
- over the completions judged correct, on tasks both versions solved in some pass (`solved`):
  ratios `correct_length` and `answer_spans` (numbers per
  completion; add-one smoothed); shares `composition` (total variation distance of the
  character classes digit, letter, space, other) and `novelty` (the share of the shape trigrams,
  digits and letters collapsed to one symbol, that the parent's correct completions never used).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from engine.harness.base import Context, Finding, analyzer
from engine.harness.cutoffs import MIN_CORRECT, floor_multiplier, log_noise_floor, share_floor

#: The features compared as a ratio of means (the others are shares or distances).
RATIO_FEATURES = frozenset({"length", "length_p90", "correct_length", "answer_spans"})

#: The text the policy wrote: a single-turn completion, or a multi-turn episode's actions.
POLICY_TEXT = (
    "CASE WHEN o.turns IS NULL THEN o.completion "
    "ELSE array_to_string(json_extract_string(o.turns, '$[*].action'), chr(10)) END"
)
CORRECT = "coalesce(o.reward_components['correctness'], o.reward) > 0"
#: Answer-like spans: numbers (integers and decimals, signed).
ANSWER_SPAN = r"[-+]?[0-9]+(\.[0-9]+)?"

_TEXTS = f"""
    WITH latest AS (
        SELECT DISTINCT ON (r.version) o.run_id, r.version FROM rollouts o JOIN runs r ON r.id = o.run_id
        WHERE r.version IN ($version, $parent) AND r.state = 'succeeded' AND o.split = 'val'
        ORDER BY r.version, r.ended_at DESC
    )
    SELECT *, correct AND bool_or(correct AND version = $version) OVER task
                      AND bool_or(correct AND version = $parent) OVER task AS solved
    FROM (
        SELECT l.version, o.task_id, o.prompt, o.sample_idx AS pass, {POLICY_TEXT} AS text, {CORRECT} AS correct,
               o.reward_components['format'] AS format
        FROM latest l JOIN rollouts o ON o.run_id = l.run_id
        WHERE o.split = 'val' AND o.decoding = 'sampled'
          AND o.step = (SELECT max(step) FROM rollouts WHERE run_id = l.run_id AND split = 'val')
    )
    WINDOW task AS (PARTITION BY task_id, prompt)
"""


@dataclass(frozen=True)
class Shift:
    """One feature of the child's form against its parent's."""

    feature: str
    kind: str  # "ratio" (child mean / parent mean) or "share" (a difference or a distance)
    value: float  # the ratio, or the share's change
    floor: float | None  # in the value's own units: how far the parent moves from itself
    parent: float
    child: float
    #: The parent's value over its correct answers: a child moving toward it is explained.
    reference: float | None = None

    @property
    def explained(self) -> bool:
        return self.reference is not None and abs(self.child - self.reference) < abs(self.parent - self.reference)

    @property
    def beyond_floor(self) -> bool:
        if self.floor is None:
            return False
        if self.kind == "ratio":
            return abs(math.log(self.value)) > self.floor
        return abs(self.value) > self.floor

    @property
    def counts(self) -> bool:
        return self.beyond_floor and not self.explained

    def finding(self, parent_name: str) -> Finding:
        floor = "no floor: one sampled pass"
        if self.kind == "ratio":
            what = f"{self.feature} {self.parent:.2f} -> {self.child:.2f} ({self.value:.2f}x"
            threshold = None if self.floor is None else math.exp(self.floor)
            if threshold is not None:
                floor = f"floor {threshold:.2f}x"
        else:
            what = f"{self.feature} {_num(self.parent)} -> {_num(self.child)} ({_num(self.value, '+')}"
            threshold = self.floor
            if threshold is not None:
                floor = f"floor {_num(threshold)}"
        toward = ""
        if self.explained:
            toward = f"; toward the parent's correct answers ({self.reference:.2f}): explained"
        return Finding(
            f"version.shift.{self.feature}",
            self.value,
            "warning" if self.counts else "info",
            f"{what}; {floor}) vs {parent_name}{toward}",
            threshold=threshold,
        )


def _num(x: float, sign: str = "") -> str:
    """Two decimals, or two significant digits for a small share (0.0013, not 0.00)."""
    return f"{x:{sign}.2f}" if x == 0 or abs(x) >= 0.01 else f"{x:{sign}.2g}"


def ratio_shift(
    feature: str,
    child: Sequence[float],
    parent: Sequence[float],
    smooth: float = 0.0,
    noise: tuple[float, float] | None = None,
) -> Shift | None:
    """Means per sampled pass of the child and the parent -> the ratio of their means, with the
    larger pass-to-pass range of the two (in log ratio, times `floor_multiplier`) as its floor;
    with `noise` (each side's standard error of the log statistic, over all its answers) never
    below that sampling noise (`log_noise_floor`)."""
    if not child or not parent:
        return None
    c, p = sum(child) / len(child) + smooth, sum(parent) / len(parent) + smooth
    if c <= 0 or p <= 0:
        return None
    logs = [[math.log(x + smooth) for x in side if x + smooth > 0] for side in (parent, child)]
    floor = _floor(*logs)
    if floor is not None and noise is not None:
        floor = max(floor, log_noise_floor(*noise))
    return Shift(feature, "ratio", c / p, floor, p - smooth, c - smooth)


def share_shift(
    feature: str, child: Sequence[float], parent: Sequence[float], rows: tuple[int, int] | None = None
) -> Shift | None:
    """Shares per sampled pass -> the change of their mean, with the larger pass-to-pass range of
    the two (times `floor_multiplier`) as its floor; with `rows` (the answers each side's shares
    were read over, all passes) never below the share's own sampling noise (`share_floor`)."""
    if not child or not parent:
        return None
    c, p = sum(child) / len(child), sum(parent) / len(parent)
    floor = _floor(parent, child)
    if floor is not None and rows is not None:
        pooled = (c * rows[0] + p * rows[1]) / max(1, rows[0] + rows[1])
        floor = max(floor, share_floor(pooled, *rows))
    return Shift(feature, "share", c - p, floor, p, c)


def _floor(parent: Sequence[float], child: Sequence[float]) -> float | None:
    """`floor_multiplier` times the larger of the two versions' pass-to-pass ranges; None (no
    cut-off, nothing counts) with fewer than two passes a side: no estimate of the noise. Ranges
    of 0 on both sides (a form every pass writes alike: one number per answer) give a floor of 0
    for a mean; a share also has its sampling noise (`share_shift`'s rows)."""
    if min(len(parent), len(child)) < 2:
        return None
    spread = max(max(side) - min(side) for side in (parent, child))
    return floor_multiplier(len(parent), len(child)) * spread


def distance_shift(
    feature: str, value: float, parent: float, child: float, spread: float | None, passes: int, rows: int | None = None
) -> Shift:
    """A distance between the child and the parent (0 = the same), with the distance between the
    parent's first pass and its others (times `floor_multiplier` of its passes) as its floor. The
    multiple is the one derived for means, and errs high here: the child-vs-parent distance pools
    every pass of each, the spread compares one pass with the rest, so it is the noisier one. A
    distance that is a share of `rows` items never has a floor below that share's binomial noise."""
    floor = None if spread is None or passes < 2 else floor_multiplier(passes, passes) * spread
    if floor is not None and rows is not None:
        floor = max(floor, share_floor(value, rows))
    return Shift(feature, "share", value, floor, parent, child)


@analyzer("form_vs_parent", "version")
def form_vs_parent(ctx: Context) -> list[Finding]:
    """How the form of the sampled val completions moved from the parent's (see the module)."""
    parent = ctx.version.parent
    if not parent:
        return []
    texts = ctx.materialize("shift_texts", _TEXTS, {"version": ctx.version.name, "parent": parent})
    per_pass = ctx.q(
        f"""
        SELECT version = $version AS mine, pass,
               avg(length(text)), quantile_cont(length(text), 0.9),
               avg(length(text)) FILTER (WHERE solved),
               avg(len(regexp_extract_all(text, '{ANSWER_SPAN}'))) FILTER (WHERE solved),
               count(DISTINCT text) / count(*), avg((format = 1)::INT) FILTER (WHERE format IS NOT NULL),
               count(*) FILTER (WHERE solved), count(*), count(format)
        FROM {texts} GROUP BY ALL ORDER BY mine, pass
        """,
        {"version": ctx.version.name},
    )
    child = [r[2:] for r in per_pass if r[0]]
    theirs = [r[2:] for r in per_pass if not r[0]]
    if not child or not theirs:
        return []

    def column(rows: list[tuple[float | None, ...]], i: int) -> list[float]:
        return [float(r[i]) for r in rows if r[i] is not None]

    def rows(i: int) -> tuple[int, int]:
        return int(sum(r[i] for r in child)), int(sum(r[i] for r in theirs))

    enough = sum(r[6] for r in child) >= MIN_CORRECT and sum(r[6] for r in theirs) >= MIN_CORRECT
    # What the parent's right answers looked like: the reference of the every-answer features.
    reference = ctx.q1(
        f"""SELECT avg(n), avg(p90), avg(d), avg(f) FROM (
                SELECT avg(length(text)) AS n, quantile_cont(length(text), 0.9) AS p90,
                       count(DISTINCT text) / count(*) AS d,
                       avg((format = 1)::INT) FILTER (WHERE format IS NOT NULL) AS f
                FROM {texts} WHERE version = $parent AND correct GROUP BY pass)""",
        {"parent": parent},
    )
    refs = reference if enough and reference else (None,) * 4
    noise = _sampling_noise(ctx, texts, parent)
    candidates: list[Shift | None] = [
        _toward(ratio_shift("length", column(child, 0), column(theirs, 0), noise=noise["length"]), refs[0]),
        _toward(ratio_shift("length_p90", column(child, 1), column(theirs, 1), noise=noise["length_p90"]), refs[1]),
        _toward(share_shift("distinct", column(child, 4), column(theirs, 4), rows(7)), refs[2]),
        _toward(share_shift("format", column(child, 5), column(theirs, 5), rows(8)), refs[3]),
    ]
    if enough:
        candidates += [
            ratio_shift("correct_length", column(child, 2), column(theirs, 2), noise=noise["correct_length"]),
            ratio_shift("answer_spans", column(child, 3), column(theirs, 3), smooth=1.0, noise=noise["answer_spans"]),
            _composition(ctx, texts),
            _novelty(ctx, texts),
        ]
    return [s.finding(parent) for s in candidates if s is not None]


def _sampling_noise(ctx: Context, texts: str, parent: str) -> dict[str, tuple[float, float]]:
    """Per ratio feature, (child, parent): the standard error of the log of the statistic over all
    of that side's answers. A mean's is sd / (mean sqrt(n)); the 90th percentile's, half the log
    distance between the quantiles one binomial standard error (sqrt(0.9 x 0.1 / n)) either side
    of 0.9 (distribution-free: the order statistics that bracket it)."""
    stats = ctx.q(
        f"""
        SELECT version = $parent AS theirs, count(*), avg(length(text)), coalesce(stddev_samp(length(text)), 0),
               count(*) FILTER (WHERE solved), avg(length(text)) FILTER (WHERE solved),
               coalesce(stddev_samp(length(text)) FILTER (WHERE solved), 0),
               avg(len(regexp_extract_all(text, '{ANSWER_SPAN}'))) FILTER (WHERE solved),
               coalesce(stddev_samp(len(regexp_extract_all(text, '{ANSWER_SPAN}'))) FILTER (WHERE solved), 0)
        FROM {texts} GROUP BY ALL ORDER BY theirs
        """,
        {"parent": parent},
    )

    def se(sd: float | None, mean: float | None, n: int) -> float:
        return 0.0 if not n or not mean or mean <= 0 else float(sd or 0.0) / (float(mean) * math.sqrt(n))

    out: dict[str, list[float]] = {"length": [], "length_p90": [], "correct_length": [], "answer_spans": []}
    for theirs, n, mean, sd, solved, c_mean, c_sd, spans, spans_sd in stats:
        out["length"].append(se(sd, mean, n))
        out["correct_length"].append(se(c_sd, c_mean, solved))
        out["answer_spans"].append(se(spans_sd, None if spans is None else spans + 1.0, solved))
        step = math.sqrt(0.9 * 0.1 / max(1, n))
        low, high = ctx.q1(
            f"SELECT quantile_cont(length(text), $low), quantile_cont(length(text), $high) FROM {texts}"
            " WHERE (version = $parent) = $theirs",
            {"low": max(0.0, 0.9 - step), "high": min(1.0, 0.9 + step), "parent": parent, "theirs": theirs},
        ) or (None, None)
        spread = math.log(high) - math.log(low) if low and high and low > 0 else 0.0
        out["length_p90"].append(spread / 2)
    return {k: (v[0], v[1]) if len(v) == 2 else (0.0, 0.0) for k, v in out.items()}


def _toward(shift: Shift | None, reference: float | None) -> Shift | None:
    return None if shift is None else replace(shift, reference=None if reference is None else float(reference))


#: Character classes of the composition feature, as regular expressions of what to keep.
_CLASSES = {"digit": "[^0-9]", "letter": "[^A-Za-z]", "space": r"[^\s]"}


def _composition(ctx: Context, texts: str) -> Shift | None:
    """Total variation distance of the character-class shares of correct completions: child vs
    parent (pooled passes), with the parent's first pass vs its others as the spread."""
    counts = ", ".join(f"sum(length(regexp_replace(text, '{keep}', '', 'g')))" for keep in _CLASSES.values())
    rows = ctx.q(
        f"""SELECT version = $version AS mine, pass = (SELECT min(pass) FROM {texts}) AS first,
                   {counts}, sum(length(text)), count(DISTINCT pass)
            FROM {texts} WHERE solved GROUP BY ALL""",
        {"version": ctx.version.name},
    )

    def shares(select: Callable[[bool, bool], bool]) -> list[float] | None:
        picked = [r[2:-1] for r in rows if select(r[0], r[1])]
        total = sum(r[-1] for r in picked)
        if not total:
            return None
        classes = [sum(r[i] for r in picked) / total for i in range(len(_CLASSES))]
        return [*classes, 1 - sum(classes)]  # the rest: punctuation and other symbols

    child, parent = shares(lambda mine, _: mine), shares(lambda mine, _: not mine)
    first, rest = shares(lambda mine, first: not mine and first), shares(lambda mine, first: not mine and not first)
    if child is None or parent is None:
        return None
    spread = _tvd(first, rest) if first is not None and rest is not None else None
    passes = sum(r[-1] for r in rows if not r[0])
    return distance_shift("composition", _tvd(child, parent), 0.0, _tvd(child, parent), spread, passes)


def _tvd(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / 2


def _novelty(ctx: Context, texts: str) -> Shift | None:
    """Share of the correct completions' shape trigrams (runs of digits -> 9, of letters -> a)
    that the parent's correct completions never used; the spread is the same share for the
    parent's later passes against its first."""
    row = ctx.q1(
        f"""
        WITH shapes AS (
            SELECT version = $version AS mine, pass = (SELECT min(pass) FROM {texts}) AS first,
                   regexp_replace(regexp_replace(text, '[0-9]+', '9', 'g'), '[A-Za-z]+', 'a', 'g') AS s
            FROM {texts} WHERE solved
        ), grams AS (
            SELECT mine, first, substr(s, i, 3) AS g FROM shapes, range(1, greatest(length(s) - 1, 1)) AS t(i)
        ),
        theirs AS (SELECT DISTINCT g FROM grams WHERE NOT mine),
        first_pass AS (SELECT DISTINCT g FROM grams WHERE NOT mine AND first)
        SELECT (SELECT avg((g NOT IN (SELECT g FROM theirs))::INT) FROM grams WHERE mine),
               (SELECT avg((g NOT IN (SELECT g FROM first_pass))::INT) FROM grams WHERE NOT mine AND NOT first),
               (SELECT count(DISTINCT pass) FROM {texts} WHERE version = $parent),
               (SELECT count(*) FROM grams WHERE mine)
        """,
        {"version": ctx.version.name, "parent": ctx.version.parent},
    )
    if not row or row[0] is None:
        return None  # the child's correct completions are too short to have a trigram
    # The parent's later passes without trigrams have nothing new in them: a spread of 0.
    novelty, spread = float(row[0]), (float(row[1] or 0.0) if row[2] >= 2 else None)
    return distance_shift("novelty", novelty, 0.0, novelty, spread, int(row[2]), int(row[3]))
