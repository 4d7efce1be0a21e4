"""DuckDB store: versions, interventions, runs, metrics, rollouts, events."""

from engine.store.connection import StoreLockedError
from engine.store.schema import SCHEMA_VERSION
from engine.store.store import RunRecord, Store, VersionRecord

__all__ = ["SCHEMA_VERSION", "RunRecord", "Store", "StoreLockedError", "VersionRecord"]
