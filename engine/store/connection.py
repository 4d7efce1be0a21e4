"""A DuckDB connection with the workspace's schema migrated: opening, cursors for other threads,
whole-result reads and nested transactions. `Store` adds the workbench's records on top."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import duckdb

from engine.store.schema import MIGRATIONS, SCHEMA_VERSION


class StoreLockedError(RuntimeError):
    """Another process holds the workspace's database (DuckDB allows one writer, no other readers)."""


class Connection:
    def __init__(self, path: Path | str):
        self.path = path
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.con = duckdb.connect(str(path))
        except duckdb.IOException as exc:
            if "lock" in str(exc).lower():
                raise StoreLockedError(
                    f"{path} is in use by another evotui process (the workspace's engine, or a `run`). "
                    "Talk to it (`evotui status`, `evotui tui`), or stop it first (`evotui engine DIR --stop`)."
                ) from None
            raise
        self.migrate()

    @classmethod
    def _on(cls, path: Path | str, con: duckdb.DuckDBPyConnection) -> Self:
        store = cls.__new__(cls)
        store.path = path
        store.con = con
        return store

    def cursor(self) -> Self:
        """Another connection to the same open database, for another thread of this process (a
        DuckDB connection is used by one thread at a time; the file may be opened by one process)."""
        return type(self)._on(self.path, self.con.cursor())

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ------------------------------------------------------------------------------
    # DuckDB 2.0 refuses some calls (e.g. register) while a result is only partly fetched, so
    # every read goes through these two and is fetched whole.
    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        return self.con.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Any = None) -> tuple[Any, ...] | None:
        rows = self.con.execute(sql, params).fetchall()
        return rows[0] if rows else None

    @contextmanager
    def temp_table(self, name: str, sql: str, params: Any = None) -> Iterator[None]:
        """A temporary table of this connection holding `sql`'s rows while the block runs: many
        queries over one costly selection read it once."""
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}", params)
        try:
            yield
        finally:
            self.con.execute(f"DROP TABLE IF EXISTS {name}")

    # -- schema -------------------------------------------------------------------------------
    def schema_version(self) -> int:
        self.con.execute("CREATE TABLE IF NOT EXISTS schema_meta (version INTEGER NOT NULL)")
        row = self.query_one("SELECT max(version) FROM schema_meta")
        return int(row[0]) if row and row[0] is not None else 0

    def migrate(self) -> int:
        """Apply every migration newer than the file's schema version; returns the new version."""
        current = self.schema_version()
        if current > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} has schema version {current}, newer than this evotui understands "
                f"({SCHEMA_VERSION}); upgrade evotui"
            )
        for number in range(current + 1, SCHEMA_VERSION + 1):
            with self.transaction():
                self.con.execute(MIGRATIONS[number - 1])
                self.con.execute("INSERT INTO schema_meta VALUES (?)", [number])
        return SCHEMA_VERSION

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One unit of writes; a transaction inside another joins it (it commits with the outer one)."""
        if getattr(self, "_in_transaction", False):
            yield
            return
        self._in_transaction = True
        try:
            with self._transaction():
                yield
        finally:
            self._in_transaction = False

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")
