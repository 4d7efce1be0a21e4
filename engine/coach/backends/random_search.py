"""Random search over the intervention catalog: the baseline an autonomous tuner must beat.

It reads nothing the harness says. Each round it draws templates from the whole catalog without
replacement (uniformly, seeded), skipping those this parent already tried or that do not apply
to its config, and draws each change's magnitude at random: a multiple of the catalog's step,
log-uniform between `1 / SPREAD` and `SPREAD`. Judging is left to the coach, so a benchmark arm
with this backend differs from the full loop in what it proposes alone. Analyzers for an
investigation come from the offline planner's templates, as in the full loop.
"""

from __future__ import annotations

import random
from typing import Any

from engine.coach.backends.base import AnalyzerSpec, ModelCall, PlanningContext, Proposals
from engine.coach.backends.offline import OfflinePlanner
from engine.coach.interventions import CATALOG, Intervention

#: Magnitudes are drawn log-uniform within this factor either side of the catalog's step.
SPREAD = 4.0


class RandomPlanner:
    name = "random"

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = random.Random(seed)
        self.calls: list[ModelCall] = []

    def propose(self, ctx: PlanningContext) -> Proposals:
        pool = [t for t in CATALOG if t.name not in ctx.tried_templates]
        self.rng.shuffle(pool)
        chosen: list[Intervention] = []
        factors: set[str] = set()
        notes = []
        for template in pool:
            size = SPREAD ** self.rng.uniform(-1, 1) if template.magnitude else None
            iv = template.propose(ctx.parent_config, [f"random draw (seed {self.seed})"], "random", ctx.facts, size)
            if iv is None or factors & set(iv.factors):
                continue
            chosen.append(iv)
            factors |= set(iv.factors)
            notes.append(template.name if size is None else f"{template.name} x{size:.2f}")
            if len(chosen) == ctx.branches:
                break
        return Proposals(
            chosen, f"random draw (seed {self.seed}): {', '.join(notes) or 'nothing applicable'}", self.name
        )

    def propose_analyzer(self, anomaly: dict[str, Any], ctx: PlanningContext) -> list[AnalyzerSpec]:
        return OfflinePlanner().propose_analyzer(anomaly, ctx)
