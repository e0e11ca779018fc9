-- Why: the job queue needs two tables in the team's own database, in schema `sluice`, so that apps can
-- enqueue inside their own transactions and workers can claim with FOR UPDATE SKIP LOCKED.
--
-- Physical design (see docs/queue.md, "Table and indexes"):
-- * `sluice.jobs` is the hot table. Every index on it is paid on every state change (a claim or a
--   completion changes `state`, which the partial indexes depend on, so those updates cannot be HOT).
--   So there are few indexes, each partial: the claim index holds only waiting jobs, the running index
--   only running jobs, the finished index only finished jobs. A heartbeat rewrites `lease_expires_at`
--   only, which no index covers, so heartbeats are HOT updates and leave no index entries behind.
-- * fillfactor 70 leaves room on each page for the HOT copies of heartbeats and for the new version
--   of a row that changes state on the same page (measured elsewhere: 100 gives ~0 % HOT, 70 ~97 %).
-- * Autovacuum runs after 1 % of the rows are dead (not the default 20 %) and without cost delay: a
--   queue table turns over all of its rows quickly, and dead tuples in front of the claim index scan
--   are what slows SKIP LOCKED queues down under load.

CREATE SCHEMA IF NOT EXISTS sluice;

-- Per-queue settings. Durations are whole milliseconds so every language can write them.
CREATE TABLE sluice.queues (
    name                    text PRIMARY KEY
                            CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'),
    max_attempts            integer NOT NULL DEFAULT 25 CHECK (max_attempts BETWEEN 1 AND 1000),
    backoff_base_ms         bigint  NOT NULL DEFAULT 1000 CHECK (backoff_base_ms >= 1),
    backoff_cap_ms          bigint  NOT NULL DEFAULT 3600000,
    backoff_multiplier      double precision NOT NULL DEFAULT 2 CHECK (backoff_multiplier >= 1),
    lease_ms                bigint  NOT NULL DEFAULT 30000 CHECK (lease_ms >= 100),
    retention_succeeded_ms  bigint  NOT NULL DEFAULT 86400000 CHECK (retention_succeeded_ms >= 0),
    retention_dead_ms       bigint  NOT NULL DEFAULT 604800000 CHECK (retention_dead_ms >= 0),
    idempotency_window_ms   bigint  NOT NULL DEFAULT 86400000 CHECK (idempotency_window_ms >= 0),
    paused                  boolean NOT NULL DEFAULT false,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CHECK (backoff_cap_ms >= backoff_base_ms)
);

CREATE TABLE sluice.jobs (
    -- UUIDv7, made by the caller (Rust) or by sluice.uuid_v7() (SQL): time-ordered, so inserts append
    -- to the right edge of the primary key instead of touching random pages.
    id                 uuid PRIMARY KEY,
    -- No foreign key to sluice.queues, on purpose: an FK check is a per-row trigger that takes FOR KEY
    -- SHARE on the queue's row, so concurrent enqueuers of one queue would pile MultiXacts onto that one
    -- row and bulk inserts would pay a trigger per row. The SQL API checks that the queue exists (SL404).
    queue              text NOT NULL,
    kind               text NOT NULL CHECK (length(kind) BETWEEN 1 AND 200),
    payload            jsonb NOT NULL,
    state              text NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'running', 'succeeded', 'retrying', 'dead', 'cancelled')),
    -- Higher runs first.
    priority           smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    -- Claims so far; the fence of every completion.
    attempt            integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    run_at             timestamptz NOT NULL DEFAULT now(),
    lease_owner        text,
    lease_expires_at   timestamptz,
    last_error         text,
    idempotency_key    text CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- SHA-256 of the request the key was first used with (kind and payload).
    payload_hash       bytea,
    cancel_requested   boolean NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz,
    CHECK (attempt >= 0 AND max_attempts >= 1 AND attempt <= max_attempts),
    -- A job is leased exactly while it runs.
    CHECK ((state = 'running') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
    -- A job has a finish time exactly when it is finished.
    CHECK ((state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    -- Only a job that has run can be running, retrying, succeeded or dead.
    CHECK (state IN ('pending', 'cancelled') OR attempt >= 1),
    CHECK (state <> 'pending' OR attempt = 0),
    CHECK (idempotency_key IS NULL OR payload_hash IS NOT NULL)
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The claim: per queue, highest priority first, then oldest run_at. Holds waiting jobs only, so it stays
-- as small as the backlog.
CREATE INDEX jobs_claim_idx ON sluice.jobs (queue, priority DESC, run_at)
    WHERE state IN ('pending', 'retrying');

-- Running jobs per queue: lease rescue and depth. Deliberately not on lease_expires_at, which every
-- heartbeat rewrites (an index on it would make heartbeats non-HOT); the running set is small
-- (bounded by workers × concurrency), so rescue filters it by expiry.
CREATE INDEX jobs_running_idx ON sluice.jobs (queue) WHERE state = 'running';

-- Finished jobs by age: retention deletes from the old end in bounded batches; dead-letter listing.
CREATE INDEX jobs_finished_idx ON sluice.jobs (queue, finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

-- Idempotency keys are unique per queue while they are set; an expired key is cleared (set NULL) when
-- it is reused, so the unique index never blocks a key past its window.
CREATE UNIQUE INDEX jobs_idempotency_idx ON sluice.jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
