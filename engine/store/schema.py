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
        state       VARCHAR NOT NULL,                 -- queued, running, interrupted, succeeded, failed
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
    # 3: the coach: rounds, gates, case memory, retrieval trace, model calls, harness evolution.
    """
    ALTER TABLE interventions ADD COLUMN round INTEGER;       -- the coach round that proposed it
    ALTER TABLE interventions ADD COLUMN template VARCHAR;    -- catalog template, '' when a model wrote it
    ALTER TABLE interventions ADD COLUMN source VARCHAR;      -- planner, skill:<id>, case, feedback, model
    ALTER TABLE interventions ADD COLUMN evidence JSON;       -- rules and findings the proposal cites
    CREATE TABLE rounds (
        id         INTEGER PRIMARY KEY,
        parent     VARCHAR NOT NULL,          -- the version the round branches from
        state      VARCHAR NOT NULL,          -- open, done, aborted
        stage      VARCHAR NOT NULL,          -- diagnosis, design, backtest, run, done
        backend    VARCHAR NOT NULL,
        harness    VARCHAR NOT NULL,          -- full, score-only
        escalated  BOOLEAN NOT NULL DEFAULT false,
        diagnosis  VARCHAR,                   -- id of the diagnosis it reasoned from
        rationale  VARCHAR,
        proposals  JSON,                      -- the interventions, with their backtests and outcomes
        started_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
        ended_at   TIMESTAMP
    );
    CREATE TABLE gates (
        id          VARCHAR PRIMARY KEY,      -- g1, g2, ...
        round       INTEGER,
        kind        VARCHAR NOT NULL,         -- after_diagnosis, after_design, after_backtest, after_completion
        subject     VARCHAR NOT NULL,         -- what it is about: the round, or a version
        question    VARCHAR NOT NULL,
        report      JSON NOT NULL,            -- the structured report a person decides on
        forced      BOOLEAN NOT NULL,         -- switched on by consecutive failures
        state       VARCHAR NOT NULL,         -- pending, approved, revised, aborted
        feedback    VARCHAR,                  -- the text of a revise answer
        answered_by VARCHAR,                  -- terminal, cli, auto
        created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp,
        answered_at TIMESTAMP
    );
    CREATE TABLE cases (
        id         VARCHAR PRIMARY KEY,       -- the version it records
        signature  VARCHAR NOT NULL,          -- the parent's failure signature: sorted fired rules
        domain     VARCHAR NOT NULL,
        parent     VARCHAR NOT NULL,
        kind       VARCHAR NOT NULL,
        template   VARCHAR,
        factor     VARCHAR NOT NULL,
        verdict    VARCHAR,
        decision   VARCHAR NOT NULL,          -- promoted, rejected, pruned, failed
        outcome    VARCHAR NOT NULL,          -- the reason, in words
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    CREATE SEQUENCE retrievals_id_seq;
    CREATE TABLE retrievals (
        id         BIGINT PRIMARY KEY DEFAULT nextval('retrievals_id_seq'),
        round      INTEGER,
        source     VARCHAR NOT NULL,          -- literature, skills, cases
        query      VARCHAR NOT NULL,
        hits       JSON NOT NULL,
        adopted    JSON NOT NULL,             -- which hits the proposals used
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    CREATE SEQUENCE model_calls_id_seq;
    CREATE TABLE model_calls (
        id            BIGINT PRIMARY KEY DEFAULT nextval('model_calls_id_seq'),
        round         INTEGER,
        backend       VARCHAR NOT NULL,
        model         VARCHAR NOT NULL,
        purpose       VARCHAR NOT NULL,
        input_tokens  INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        ok            BOOLEAN NOT NULL,
        error         VARCHAR,
        seconds       DOUBLE,
        created_at    TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    CREATE TABLE harness_proposals (
        id          VARCHAR PRIMARY KEY,
        round       INTEGER,
        name        VARCHAR NOT NULL,
        layer       VARCHAR NOT NULL,
        spec        JSON NOT NULL,
        source      VARCHAR NOT NULL,         -- template or model
        auc         DOUBLE,                   -- separation of improved vs regressed past versions
        n_improved  INTEGER NOT NULL,
        n_regressed INTEGER NOT NULL,
        adopted     BOOLEAN NOT NULL,
        reason      VARCHAR NOT NULL,
        file        VARCHAR,                  -- the workspace harness file, when adopted
        commit_sha  VARCHAR,
        created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    """,
    # 4: each rollout carries its group's reward spread, so "dead group" is a plain predicate
    # (the rollout browser filters millions of rows by it); filled at ingest, backfilled here.
    """
    ALTER TABLE rollouts ADD COLUMN group_std DOUBLE;
    UPDATE rollouts SET group_std = g.spread
    FROM (
        SELECT run_id, split, decoding, step, group_id, stddev_pop(reward) AS spread
        FROM rollouts GROUP BY ALL
    ) g
    WHERE rollouts.run_id = g.run_id AND rollouts.split = g.split AND rollouts.decoding = g.decoding
      AND rollouts.step = g.step AND rollouts.group_id = g.group_id;
    """,
    # 5: `evotui bench`: one row per seed and arm, one report per invocation.
    """
    CREATE TABLE bench_results (
        bench_id        VARCHAR NOT NULL,
        seed            INTEGER NOT NULL,
        arm             VARCHAR NOT NULL,     -- base, hand, score-only, full
        final_version   VARCHAR NOT NULL,     -- the arm's answer: its best promoted version (hand: v1)
        clean_greedy    DOUBLE,               -- val correctness on the clean environment
        clean_sampled   DOUBLE,
        clean_halfwidth DOUBLE,               -- 95% noise floor of clean_sampled over val tasks
        seen_greedy     DOUBLE,               -- val as the arm saw it (leaky while the switch was on)
        versions        INTEGER NOT NULL,
        steps           INTEGER NOT NULL,     -- GRPO steps the arm trained
        cpu_seconds     DOUBLE NOT NULL,
        wall_seconds    DOUBLE NOT NULL,
        details         JSON NOT NULL,        -- every version: change, scores, rules, decision
        workspace       VARCHAR NOT NULL,     -- the arm's clone
        created_at      TIMESTAMP NOT NULL DEFAULT current_timestamp,
        PRIMARY KEY (bench_id, seed, arm)
    );
    CREATE TABLE bench_reports (
        bench_id   VARCHAR PRIMARY KEY,
        settings   JSON NOT NULL,
        findings   JSON NOT NULL,
        report     VARCHAR NOT NULL,          -- the Markdown report
        created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
    );
    """,
    # 6: harness evolution investigates an unexplained verdict before the decision: each proposed
    # analyzer is measured on the version's val answers against its parent's (a probe).
    """
    ALTER TABLE harness_proposals ADD COLUMN version VARCHAR;  -- the version whose anomaly it investigated
    ALTER TABLE harness_proposals ADD COLUMN probe JSON;       -- child vs parent on val: value, floor, counts
    """,
    # 7: a verdict's primary comparison with its noise floor, beside the scores it compares.
    """
    ALTER TABLE versions ADD COLUMN verdict_delta DOUBLE;      -- child - parent on the primary comparison
    ALTER TABLE versions ADD COLUMN verdict_floor DOUBLE;      -- its 95% half-width
    """,
    # 8: the benchmark reports each arm on the test split (no arm decided on it).
    """
    ALTER TABLE bench_results ADD COLUMN test_greedy DOUBLE;
    ALTER TABLE bench_results ADD COLUMN test_sampled DOUBLE;
    ALTER TABLE bench_results ADD COLUMN test_halfwidth DOUBLE;     -- 95% noise floor of test_sampled
    """,
    # 9: the verifier audit: a second opinion on every evaluated answer whose task has a reference.
    """
    ALTER TABLE rollouts ADD COLUMN reference VARCHAR;  -- the task's reference answer (evaluation only)
    ALTER TABLE rollouts ADD COLUMN audit BOOLEAN;      -- the audit's reading; NULL: no audit applies
    """,
    # 10: the agreement of accepted answers: each evaluated answer's canonical final answer.
    """
    ALTER TABLE rollouts ADD COLUMN answer_key VARCHAR; -- NULL: the domain's tasks have many right answers
    """,
    # 11: memory only from versions that earned it: a version flagged after its decision, and the
    # case that recorded it, are marked (kept, never retrieved).
    """
    ALTER TABLE versions ADD COLUMN flagged VARCHAR;    -- why the version was flagged after its decision
    ALTER TABLE cases ADD COLUMN retracted VARCHAR;     -- why the case is no longer retrieved
    """,
    # 12: a control in every round: each case records the branch against its parent's control.
    """
    ALTER TABLE cases ADD COLUMN control VARCHAR;           -- the control it was compared with (NULL: none)
    ALTER TABLE cases ADD COLUMN vs_control VARCHAR;        -- that comparison's label (improved, regressed, ...)
    ALTER TABLE cases ADD COLUMN vs_control_delta DOUBLE;   -- its primary difference
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)
