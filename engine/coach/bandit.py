"""Which changes pay in this workspace: a Thompson-sampling ranking of the catalog's templates.

The evidence for a template is this workspace's decided branches of it (cases not retracted):
a branch *won* when it beat its parent's control on val (`vs_control = 'improved'`), or, where it
was compared with no control, when it was promoted; every other decided branch lost (it did not
beat the control, or was pruned, rejected or failed). The control itself is no arm.

The prior says what is known before this workspace's evidence: Beta(3, 1) for a template that
answers the parent's bottleneck (the first rule that fired), Beta(2, 1) for one that answers
another rule that fired (the diagnosis is evidence), Beta(1, 2) for the others, and one more win
for each matching skill card naming the template (what paid before, here or in
another domain). Each round draws one success rate per template from its posterior, with a
generator seeded by the round, and the planner tries templates in the order of their draws: a
template with little evidence is drawn high now and then (exploration); one that keeps losing to
its control sinks (exploitation).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from engine.coach.interventions import CATALOG, CONTROL
from engine.store import Store


@dataclass(frozen=True)
class Arm:
    """One template's standing in a round: its evidence, its prior, its posterior mean and draw."""

    template: str
    kind: str
    won: int
    lost: int
    prior: tuple[int, int]
    draw: float

    @property
    def mean(self) -> float:
        a, b = self.prior[0] + self.won, self.prior[1] + self.lost
        return a / (a + b)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"prior": list(self.prior), "mean": round(self.mean, 3), "draw": round(self.draw, 3)}


def evidence(store: Store, domain: str) -> dict[str, tuple[int, int]]:
    """template -> (won, lost) over this workspace's decided branches in `domain`."""
    rows = store.query(
        """
        WITH c AS (
            SELECT template, coalesce(vs_control = 'improved', decision = 'promoted') AS won
            FROM cases WHERE domain = ? AND retracted IS NULL AND coalesce(template, '') NOT IN ('', ?)
        )
        SELECT template, count(*) FILTER (WHERE won), count(*) FILTER (WHERE NOT won) FROM c GROUP BY template
        """,
        [domain, CONTROL],
    )
    return {template: (int(won), int(lost)) for template, won, lost in rows}


def rank(
    store: Store,
    domain: str,
    fired: Iterable[str],
    skills: Iterable[dict[str, Any]],
    seed: str,
    bottleneck: str | None = None,
) -> list[Arm]:
    """Every catalog template with its draw for this round, highest draw first."""
    fired = set(fired)
    seen = evidence(store, domain)
    carded: dict[str, int] = {}
    for card in skills:
        name = card.get("intervention", {}).get("template", "")
        carded[name] = carded.get(name, 0) + 1
    rng = random.Random(zlib.crc32(seed.encode()))
    arms = []
    for t in CATALOG:
        relevant = bool(fired & set(t.triggers)) or ("" in t.triggers and not fired)
        wins = (3 if bottleneck in t.triggers else 2) if relevant else 1
        prior = (wins + carded.get(t.name, 0), 1 if relevant else 2)
        won, lost = seen.get(t.name, (0, 0))
        arms.append(Arm(t.name, t.kind, won, lost, prior, rng.betavariate(prior[0] + won, prior[1] + lost)))
    return sorted(arms, key=lambda a: -a.draw)
