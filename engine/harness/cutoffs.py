"""The cut-offs of the findings that judge a gain (audit, agreement, form shift), in one place.

None of them is a constant fitted to a test domain. Each is either a stated test at a stated level
(the paired bootstrap the verdict uses, 95%) or a multiple of the parent's own pass-to-pass spread
(the same policy, sampled again), with the multiple derived from a stated false-alarm rate, never
below the sampling noise of what it measures at that rate (`share_floor`, `log_noise_floor`). The
principle of each is written beside it; `evotui report` and the docs quote them from here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from engine.verdict import paired_bootstrap

#: The level of every paired test here: the verdict's own (a 95% paired bootstrap over val tasks),
#: so a gain and the test of what it rests on are held to the same standard.
LEVEL = 0.95

#: A form feature's shift counts when |mean(child) - mean(parent)| over their passes lies beyond
#: a multiple of the spread of the same policy sampled again: the larger of the two versions'
#: pass-to-pass ranges (`max - min` over each one's passes; the larger, because a feature that one
#: version writes identically in every pass, one number per answer say, has a range of 0 there).
#: Principle: a stated false-alarm rate, not an effect size. FLOOR_ALPHA is 5% per version, split
#: over the eight features read (Bonferroni), and `floor_multiplier(k, k)` is the multiple that
#: pure noise (k normal passes a side) exceeds with that probability: 1.13x the range at 4 passes
#: (the samples'), 1.90x at 3, 7.09x at 2, 0.49x at 8.
FLOOR_ALPHA = 0.05 / 8
#: Draws of the null comparison behind `floor_multiplier` (seeded: the same multiple every time).
FLOOR_DRAWS = 400_000

#: Correct completions each version needs before the features read from correct answers alone
#: are computed: fewer, and one odd answer moves a mean. A floor on data, not a threshold on a
#: finding (a feature without it is simply not reported).
MIN_CORRECT = 20


@functools.lru_cache(maxsize=32)
def floor_multiplier(parent_passes: int, child_passes: int) -> float:
    """The multiple of the larger pass-to-pass range that |mean(child) - mean(parent)| exceeds
    with probability FLOOR_ALPHA when both are the same policy, sampled `parent_passes` and
    `child_passes` times (normal noise; the ratio does not depend on its scale)."""
    if min(parent_passes, child_passes) < 2:
        raise ValueError("a range needs at least two passes a side")
    rng = np.random.default_rng(0)
    parent = rng.standard_normal((FLOOR_DRAWS, parent_passes))
    child = rng.standard_normal((FLOOR_DRAWS, child_passes))
    spread = np.maximum(np.ptp(parent, axis=1), np.ptp(child, axis=1))
    ratio = np.abs(child.mean(axis=1) - parent.mean(axis=1)) / spread
    return float(np.quantile(ratio, 1 - FLOOR_ALPHA))


def share_floor(share: float, *rows: int) -> float:
    """The least floor of a share's shift: its sampling noise alone. Two policies with the same
    share, read over `rows` answers each (all passes; one side alone for a share measured against
    a fixed reference), differ by more than this with probability FLOOR_ALPHA (binomial, normal
    approximation), the share estimated as Jeffreys does, so never 0 or 1. Principle: the same
    false-alarm rate as `floor_multiplier`; a pass-to-pass range of 0 (passes that happen to
    agree, a share near 0 or 1) is no evidence that the noise is 0, so a range alone never makes
    every move real."""
    if not rows or min(rows) < 1:
        return math.inf
    n = sum(rows)
    p = (share * n + 0.5) / (n + 1)
    z = NormalDist().inv_cdf(1 - FLOOR_ALPHA / 2)
    return z * math.sqrt(p * (1 - p) * sum(1 / r for r in rows))


def log_noise_floor(*log_ses: float) -> float:
    """The least floor of a ratio feature's shift, in log units: its sampling noise alone. Two
    policies alike, each side's log mean (or log quantile) read with standard error `log_ses`,
    differ by more than this with probability FLOOR_ALPHA (normal approximation). Principle: the
    same false-alarm rate as `floor_multiplier` and `share_floor`; passes that happen to agree (a
    90th percentile that lands on the same pile of answers in every pass) are no evidence that the
    noise is 0, so a pass-to-pass range alone never makes every move real."""
    z = NormalDist().inv_cdf(1 - FLOOR_ALPHA / 2)
    return z * math.sqrt(sum(se * se for se in log_ses))


@dataclass(frozen=True)
class PairedGain:
    """child - parent over the same tasks, with the paired bootstrap's interval at LEVEL."""

    delta: float
    low: float
    high: float

    @classmethod
    def of(cls, parent: np.ndarray, child: np.ndarray) -> PairedGain:
        low, high = paired_bootstrap(parent, child)
        return cls(float(child.mean() - parent.mean()), low, high)

    @property
    def significant(self) -> bool:
        return self.low > 0

    def __str__(self) -> str:
        return f"{self.delta:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def unsupported(verifier: PairedGain, second: PairedGain) -> bool:
    """A gain the verifier sees (its interval above 0) that a second reading of the same answers
    (the audit, or only the answers that agree) does not: that interval reaches 0 or below.
    Principle: the same test as the verdict, on the same tasks, so a version is blocked only for a
    gain the verdict itself would call one."""
    return verifier.significant and not second.significant
