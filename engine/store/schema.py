"""The store's schema as forward migrations. Never edit a shipped migration: append a new one."""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: versions, interventions, runs, metrics, rollouts, events, ingest bookkeeping.
    """
    CREATE TABLE versions (
        name            VARCHAR PRIMARY KEY,          -- v0, v1, ...
        parent          VARCHAR,                      -- NULL for the base v0
        branch          VARCHAR NOT NULL,             -- versions/vN in the workspace repository
        commit_sha      VARCHAR NOT NULL,
        -- state: created, training, trained, failed, promoted, rejected
        state           VARCHAR NOT NULL,
        intervention_id VARCHAR,
        checkpoint      VARCHAR,                      -- model directory, relative to the workspace
        val_greedy      DOUBLE,
        val_sampled     DOUBLE,
        val_n           INTEGER,                      -- val tasks behind the scores
        verdict         VARCHAR,                      -- improved, regressed, mixed, insufficient evidence
        decision_reason VARCHAR,
        created_at      TIMESTAMP NOT NULL DEFAULT current_timestamp,
        decided_at      TIMESTAMP
    );
    CREATE TABLE interventions (
        id                VARCHAR PRIMARY KEY,
        version           VARCHAR NOT NULL,
        kind              VARCHAR NOT NULL,           -- recipe, reward, filter, data, budget, ...
        factor            VARCHAR NOT NULL,           -- the one factor changed, e.g. recipe.learning_rate
        change            JSON NOT NULL,              -- {"field": {"from": ..., "to": ...}}
        hypothesis        VARCHAR NOT NULL,
        success_criterion VARCHAR NOT NULL,
        rollback          VARCHAR NOT NULL,
        created_at        TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    CREATE TABLE runs (
        id          VARCHAR PRIMARY KEY,
        version     VARCHAR NOT NULL,
        kind        VARCHAR NOT NULL,                 -- warmup, train, eval
        state       VARCHAR NOT NULL,                 -- queued, running, succeeded, failed
        run_dir     VARCHAR NOT NULL,
        config      JSON NOT NULL,
        total_steps INTEGER,
        pid         INTEGER,
        error_tail  VARCHAR,
        started_at  TIMESTAMP,
        ended_at    TIMESTAMP
    );
    CREATE TABLE metrics (
        run_id VARCHAR NOT NULL,
        step   INTEGER NOT NULL,
        key    VARCHAR NOT NULL,
        value  DOUBLE,
        PRIMARY KEY (run_id, step, key)
    );
    CREATE TABLE rollouts (
        run_id            VARCHAR NOT NULL,
        step              INTEGER NOT NULL,
        split             VARCHAR NOT NULL,           -- train, val
        decoding          VARCHAR NOT NULL,           -- sampled, greedy
        group_id          INTEGER NOT NULL,           -- GRPO group within the step (val: task index)
        sample_idx        INTEGER NOT NULL,           -- sample within the group (val: 0 greedy, 1.. sampled)
        task_id           VARCHAR NOT NULL,
        subset            VARCHAR,
        prompt            VARCHAR NOT NULL,
        completion        VARCHAR NOT NULL,
        reward            DOUBLE NOT NULL,            -- weighted sum of the components
        reward_components MAP(VARCHAR, DOUBLE) NOT NULL,
        truncated         BOOLEAN NOT NULL,
        completion_length INTEGER NOT NULL,           -- tokens, EOS included when present
        -- multi-turn domains only: every turn's text (JSON), their count, and the tool calls,
        -- typed so that behavior analytics never parse JSON
        turns             JSON,
        num_turns         INTEGER,
        tool_calls        STRUCT(turn INTEGER, tool VARCHAR, args VARCHAR, ok BOOLEAN, files VARCHAR[])[],
        PRIMARY KEY (run_id, split, step, group_id, sample_idx)
    );
    CREATE SEQUENCE events_id_seq;
    CREATE TABLE events (
        id      BIGINT PRIMARY KEY DEFAULT nextval('events_id_seq'),
        ts      TIMESTAMP NOT NULL DEFAULT current_timestamp,
        run_id  VARCHAR,
        version VARCHAR,
        kind    VARCHAR NOT NULL,
        payload JSON
    );
    CREATE TABLE ingest_state (
        run_id        VARCHAR PRIMARY KEY,
        events_offset BIGINT NOT NULL                 -- bytes of events.jsonl already ingested
    );
    CREATE TABLE ingested_files (
        run_id VARCHAR NOT NULL,
        file   VARCHAR NOT NULL,
        rows   INTEGER NOT NULL,
        PRIMARY KEY (run_id, file)
    );
    """,
    # 2: diagnoses and their findings; backtests.
    """
    CREATE TABLE diagnoses (
        id               VARCHAR PRIMARY KEY,
        version          VARCHAR NOT NULL,
        run_id           VARCHAR NOT NULL,
        harness_revision VARCHAR NOT NULL,   -- built-in version + hash of the workspace harness files
        bottleneck       VARCHAR,            -- the first rule that fired, by severity then priority
        rules            JSON NOT NULL,      -- every rule that fired, with explanation and evidence metrics
        candidate_kinds  JSON NOT NULL,      -- intervention kinds the rules suggest
        created_at       TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    CREATE TABLE findings (
        diagnosis_id VARCHAR NOT NULL,
        idx          INTEGER NOT NULL,
        analyzer     VARCHAR NOT NULL,
        provenance   VARCHAR NOT NULL,       -- built-in, workspace, proposed
        layer        VARCHAR NOT NULL,       -- score, signal, behavior, version
        metric       VARCHAR NOT NULL,
        value        DOUBLE,
        threshold    DOUBLE,
        severity     VARCHAR NOT NULL,       -- info, warning, critical
        explanation  VARCHAR NOT NULL,
        evidence     JSON NOT NULL,          -- {"steps": [...], "rollouts": ["run/split/step/group/sample"]}
        PRIMARY KEY (diagnosis_id, idx)
    );
    CREATE TABLE backtests (
        id         VARCHAR PRIMARY KEY,
        kind       VARCHAR NOT NULL,         -- reward, filter, analyzer
        run_id     VARCHAR,
        params     JSON NOT NULL,
        result     JSON NOT NULL,
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)
