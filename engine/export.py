"""Rollouts and metrics out of the store as Parquet files, for analysis elsewhere (pandas, polars,
DuckDB). `evotui export` calls these.

Each export is one DuckDB `COPY (SELECT ...) TO` into a temporary file beside the target, renamed
over it once complete: a failed export never leaves a half-written file. Every row carries its
run's version and kind, so a file read on its own says what it holds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb

from engine.domains.base import SPLITS
from engine.store import Store

_ROLLOUTS = """
    SELECT runs.version, runs.kind AS run_kind, r.*
    FROM rollouts r JOIN runs ON runs.id = r.run_id
    {where}
    ORDER BY r.run_id, r.split, r.decoding, r.step, r.group_id, r.sample_idx
"""

_METRICS = """
    SELECT runs.version, runs.kind AS run_kind, m.run_id, m.step, m.key, m.value
    FROM metrics m JOIN runs ON runs.id = m.run_id
    {where}
    ORDER BY m.run_id, m.step, m.key
"""


class ExportError(ValueError):
    """An export the store cannot answer (an unknown version or split), or a target it cannot write."""


def export_rollouts(store: Store, path: Path | str, version: str | None = None, split: str | None = None) -> int:
    """Write the rollouts of `version` on `split` (None: every one) to `path` as Parquet, each with
    its run's `version` and `run_kind`; returns the rows written (0 is a valid answer)."""
    _check_version(store, version)
    _check_split(store, split)
    where, params = _where({"runs.version": version, "r.split": split})
    return _copy(store, _ROLLOUTS.format(where=where), params, Path(path))


def export_metrics(store: Store, path: Path | str, version: str | None = None) -> int:
    """Write the metrics (long format: run, step, key, value) of `version`'s runs (None: every
    run) to `path` as Parquet, each with its run's `version` and `run_kind`; returns the rows written."""
    _check_version(store, version)
    where, params = _where({"runs.version": version})
    return _copy(store, _METRICS.format(where=where), params, Path(path))


def _where(filters: dict[str, str | None]) -> tuple[str, list[Any]]:
    """A WHERE clause over the filters that are set; the column names are this module's, the
    values are bound."""
    chosen = {column: value for column, value in filters.items() if value is not None}
    if not chosen:
        return "", []
    return "WHERE " + " AND ".join(f"{column} = ?" for column in chosen), list(chosen.values())


def _check_version(store: Store, version: str | None) -> None:
    if version is None:
        return
    known = [
        row[0]
        for row in store.query(
            "SELECT name FROM versions UNION SELECT version FROM runs"
            " ORDER BY TRY_CAST(substr(name, 2) AS INTEGER) NULLS LAST, name"
        )
    ]
    if version not in known:
        have = f"it has {', '.join(known)}" if known else "it has no versions yet"
        raise ExportError(f"unknown version {version!r}: {have}")


def _check_split(store: Store, split: str | None) -> None:
    """A split is known if a domain draws it (`test` before any `evotui eval`: 0 rows) or if
    rollouts of it are stored (`clean`, from a leaky workspace's evaluations)."""
    if split is None:
        return
    stored = [row[0] for row in store.query("SELECT DISTINCT split FROM rollouts ORDER BY split")]
    known = [*SPLITS, *(s for s in stored if s not in SPLITS)]
    if split not in known:
        raise ExportError(f"unknown split {split!r}: the splits are {', '.join(known)}")


def _sql_string(text: str) -> str:
    """A SQL string literal: DuckDB binds no parameter in COPY's target."""
    return "'" + text.replace("'", "''") + "'"


def _copy(store: Store, select: str, params: list[Any], target: Path) -> int:
    if not target.parent.is_dir():
        raise ExportError(f"cannot write {target}: the directory {target.parent} does not exist")
    if target.is_dir():
        raise ExportError(f"cannot write {target}: it is a directory")
    # Beside the target, so the rename stays on one file system; DuckDB creates it (the umask's mode).
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        row = store.query_one(f"COPY ({select}) TO {_sql_string(str(tmp))} (FORMAT parquet)", params)
        os.replace(tmp, target)
    except (OSError, duckdb.IOException) as exc:
        raise ExportError(f"cannot write {target}: {exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return int(row[0]) if row else 0
