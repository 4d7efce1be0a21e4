"""What the engine reads about versions and runs: a version's config as its branch holds it, the
runs a version is judged and diagnosed from, the best version to branch from, a run's curves.

Nothing here writes. A `Reader` reads through one store connection and one version tree, so a
thread other than the engine's builds one of its own (`Engine.view`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from engine.config import CONFIG_FILE, WorkspaceConfig, decode_config, parse_config
from engine.store import RunRecord, Store, VersionRecord
from engine.versions import VersionTree


class Reader:
    def __init__(self, store: Store, tree: VersionTree, root: Path):
        self.store = store
        self.tree = tree
        self.root = root

    # -- versions -----------------------------------------------------------------------------
    def config_text(self, version: str) -> str:
        """The text of a version's workspace.toml (errors name it as `versions/vN:workspace.toml`)."""
        return decode_config(self.tree.read(version, CONFIG_FILE), self._config_label(version))

    def version_config(self, version: str) -> WorkspaceConfig:
        return parse_config(self.config_text(version), self._config_label(version), self.root)

    def _config_label(self, version: str) -> Path:
        return Path(f"{self.tree.branch(version)}:{CONFIG_FILE}")

    def next_version_name(self) -> str:
        names = {v.name for v in self.store.list_versions()} | set(self.tree.versions())
        n = 1 + max((int(v[1:]) for v in names), default=-1)
        return f"v{n}"

    def best_version(self) -> VersionRecord | None:
        return best_version(self.store.list_versions(), yardsticks(self.store))

    # -- runs -----------------------------------------------------------------------------------
    def eval_run(self, version: str) -> RunRecord | None:
        """The version's latest succeeded run that evaluated it on val."""
        row = self.store.query_one(
            """
            SELECT r.id FROM runs r
            WHERE r.version = ? AND r.state = 'succeeded'
              AND EXISTS (SELECT 1 FROM rollouts o WHERE o.run_id = r.id AND o.split = 'val')
            ORDER BY r.ended_at DESC LIMIT 1
            """,
            [version],
        )
        return self.store.get_run(row[0]) if row else None

    def train_run(self, version: str) -> RunRecord | None:
        runs = [r for r in self.store.list_runs(version) if r.kind == "train" and r.state == "succeeded"]
        return runs[-1] if runs else None

    def latest_run(self, version: str) -> RunRecord:
        """The run a version is diagnosed from: its last succeeded train run, else its warm-up."""
        runs = [r for r in self.store.list_runs(version) if r.state == "succeeded" and r.kind != "eval"]
        if not runs:
            raise ValueError(f"{version} has no succeeded run to diagnose")
        trained = [r for r in runs if r.kind == "train"]
        return (trained or runs)[-1]

    def latest_train_run_from(self, version: str) -> RunRecord | None:
        """The latest succeeded GRPO run that trained `version` or started from it (one of its
        children): what training does to this policy."""
        row = self.store.query_one(
            """SELECT r.id FROM runs r JOIN versions v ON v.name = r.version
               WHERE r.kind = 'train' AND r.state = 'succeeded' AND (v.name = ? OR v.parent = ?)
               ORDER BY r.ended_at DESC LIMIT 1""",
            [version, version],
        )
        return self.store.get_run(row[0]) if row else None

    def train_curve_summary(self, run_id: str, window: int = 10) -> dict[str, tuple[float | None, float | None]]:
        """Mean of reward, dead-group ratio and truncation over the first and last `window` steps."""
        rows = self.store.query(
            """
            WITH m AS (
                SELECT key, step, value,
                       row_number() OVER (PARTITION BY key ORDER BY step) AS first_rank,
                       row_number() OVER (PARTITION BY key ORDER BY step DESC) AS last_rank
                FROM metrics
                WHERE run_id = ? AND key IN ('reward', 'frac_reward_zero_std', 'completions/clipped_ratio')
            )
            SELECT key, avg(value) FILTER (WHERE first_rank <= ?), avg(value) FILTER (WHERE last_rank <= ?)
            FROM m GROUP BY key
            """,
            [run_id, window, window],
        )
        return {key: (first, last) for key, first, last in rows}


def version_score(greedy: float | None, sampled: float | None) -> float | None:
    """A version's val score for ranking: the mean of greedy and sampled correctness (whichever
    exist). The coach branches from the promoted version with the highest."""
    values = [x for x in (greedy, sampled) if x is not None]
    return sum(values) / len(values) if values else None


def yardsticks(store: Store) -> set[str]:
    """Promoted controls that a promoted factor branch beside them was not found worse than (its
    comparison with the control on val not `regressed`). Such a factor trained the control's steps
    too, from the same parent, plus its own change, which the control did not beat: the control
    measured it, and the lineage goes on from the factor."""
    rows = store.query(
        """SELECT DISTINCT c.control FROM cases c
           JOIN versions f ON f.name = c.id JOIN versions k ON k.name = c.control
           WHERE f.state = 'promoted' AND k.state = 'promoted' AND c.retracted IS NULL
             AND c.vs_control IS NOT NULL AND c.vs_control <> 'regressed'"""
    )
    return {name for (name,) in rows}


def best_version(versions: Iterable[VersionRecord], yardsticks: Iterable[str] = ()) -> VersionRecord | None:
    """The version the coach branches from: of the promoted versions that no promoted child has
    superseded (a promoted child beat its parent on evidence, on common ground even when it
    changed the environment its own val is scored in), nor a promoted factor branch beside it
    (`yardsticks`: a control whose factor it did not beat), the one with the highest
    `version_score` (ties: the older version)."""
    versions = list(versions)
    superseded = {v.parent for v in versions if v.state == "promoted" and v.parent is not None} | set(yardsticks)
    promoted = [v for v in versions if v.state == "promoted" and v.name not in superseded]

    def rank(v: VersionRecord) -> tuple[float, int]:
        score = version_score(v.val_greedy, v.val_sampled)
        return (float("-inf") if score is None else score, -int(v.name[1:]))

    return max(promoted, key=rank, default=None)
