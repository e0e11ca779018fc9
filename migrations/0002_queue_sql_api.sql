-- Why: apps in any language enqueue inside their own transaction, so enqueueing (with idempotency keys
-- and the wake-up NOTIFY) is an SQL function API rather than logic in one client library. The Rust
-- library and the sidecar's HTTP API call these same functions, so the semantics exist once.
--
-- Errors callers can rely on (SQLSTATE):
--   SL404  the queue does not exist
--   SL409  the idempotency key was used with a different kind or payload within the key's window

-- UUIDv7 (PostgreSQL 15 has no built-in): 48 bits of Unix milliseconds, then random bits, with the
-- version nibble turned from 4 into 7.
CREATE OR REPLACE FUNCTION sluice.uuid_v7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
            PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
            FROM 1 FOR 6), 52, 1), 53, 1),
        'hex')::uuid
$$;

-- Creates a queue with the given settings unless it exists (existing settings are left alone).
-- Returns whether it was created.
CREATE OR REPLACE FUNCTION sluice.create_queue(
    name text,
    max_attempts integer DEFAULT 25,
    backoff_base_ms bigint DEFAULT 1000,
    backoff_cap_ms bigint DEFAULT 3600000,
    backoff_multiplier double precision DEFAULT 2,
    lease_ms bigint DEFAULT 30000,
    retention_succeeded_ms bigint DEFAULT 86400000,
    retention_dead_ms bigint DEFAULT 604800000,
    idempotency_window_ms bigint DEFAULT 86400000
) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    WITH ins AS (
        INSERT INTO sluice.queues (name, max_attempts, backoff_base_ms, backoff_cap_ms, backoff_multiplier,
                                   lease_ms, retention_succeeded_ms, retention_dead_ms, idempotency_window_ms)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM ins)
$$;

-- Enqueues one job and says whether it was created. With an idempotency key (Stripe semantics): the
-- same key with the same kind and payload within the queue's window returns the original job
-- (created = false); with a different kind or payload it raises SL409; after the window the old job
-- keeps running its course but loses the key, and a new job is made.
--
-- Concurrent calls with one key make one job: the unique index makes the second INSERT wait for the
-- first transaction and then skip (or insert, if the first rolled back).
CREATE OR REPLACE FUNCTION sluice.enqueue_job(
    p_queue text,
    p_kind text,
    p_payload jsonb,
    p_priority integer DEFAULT 0,
    p_run_at timestamptz DEFAULT NULL,
    p_max_attempts integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_id uuid DEFAULT NULL
) RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    q        sluice.queues;
    v_id     uuid := coalesce(p_id, sluice.uuid_v7());
    v_hash   bytea;
    v_old    sluice.jobs;
    v_tries  integer := 0;
BEGIN
    SELECT * INTO q FROM sluice.queues WHERE sluice.queues.name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', p_queue USING ERRCODE = 'SL404';
    END IF;
    IF p_idempotency_key IS NULL THEN
        INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at)
        VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                coalesce(p_run_at, now()));
    ELSE
        v_hash := sha256(convert_to(p_kind || E'\n' || p_payload::text, 'UTF8'));
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'idempotency key "%" is contended', p_idempotency_key
                    USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     idempotency_key, payload_hash)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    coalesce(p_run_at, now()), p_idempotency_key, v_hash)
            ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_old FROM sluice.jobs j
             WHERE j.queue = p_queue AND j.idempotency_key = p_idempotency_key;
            CONTINUE WHEN NOT FOUND; -- the holder was deleted or lost its key meanwhile: try again
            IF v_old.created_at < now() - q.idempotency_window_ms * interval '1 millisecond' THEN
                UPDATE sluice.jobs j SET idempotency_key = NULL
                 WHERE j.id = v_old.id AND j.idempotency_key = p_idempotency_key;
                CONTINUE;
            END IF;
            IF v_old.payload_hash IS DISTINCT FROM v_hash THEN
                RAISE EXCEPTION 'idempotency key "%" was used with a different request', p_idempotency_key
                    USING ERRCODE = 'SL409';
            END IF;
            id := v_old.id;
            created := false;
            RETURN NEXT;
            RETURN;
        END LOOP;
    END IF;
    PERFORM sluice.notify_ready(p_queue, coalesce(p_run_at, now()));
    id := v_id;
    created := true;
    RETURN NEXT;
END;
$$;

-- The wake-up hint: NOTIFY sluice_jobs with the queue name, only for jobs ready now. PostgreSQL folds
-- identical notifications of one transaction into one, so a bulk insert notifies once. Off when the
-- session or database sets `sluice.notify = off` (NOTIFY serialises commits; at high enqueue rates
-- polling alone is better).
CREATE OR REPLACE FUNCTION sluice.notify_ready(p_queue text, p_run_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_run_at <= now() AND coalesce(current_setting('sluice.notify', true), '') <> 'off' THEN
        PERFORM pg_notify('sluice_jobs', p_queue);
    END IF;
END;
$$;

-- Enqueues one job and returns its id (see enqueue_job for the idempotency rules).
-- Example: SELECT sluice.enqueue('emails', '{"to":"a@b.c"}', kind => 'welcome');
CREATE OR REPLACE FUNCTION sluice.enqueue(
    queue text,
    payload jsonb,
    kind text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT e.id FROM sluice.enqueue_job($1, $3, $2, $4, $5, $6, $7) e
$$;

-- Enqueues many jobs in one statement (no idempotency keys) and returns their ids in input order.
-- `kinds` may hold one kind for all; `priorities`, `run_ats` and `ids` may be NULL or shorter (NULL =
-- defaults; callers that can make UUIDv7s themselves pass `ids`, which saves generating them here).
CREATE OR REPLACE FUNCTION sluice.enqueue_many(
    queue text,
    payloads jsonb[],
    kinds text[] DEFAULT ARRAY['default'],
    priorities integer[] DEFAULT NULL,
    run_ats timestamptz[] DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    ids uuid[] DEFAULT NULL
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q sluice.queues;
BEGIN
    SELECT * INTO q FROM sluice.queues WHERE sluice.queues.name = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', $1 USING ERRCODE = 'SL404';
    END IF;
    RETURN QUERY
    INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at)
    SELECT coalesce(u.id, sluice.uuid_v7()), $1,
           CASE WHEN cardinality($3) = 1 THEN $3[1] ELSE u.kind END,
           u.payload, coalesce(u.priority, 0), coalesce($6, q.max_attempts), coalesce(u.run_at, now())
      FROM unnest($2, $3, coalesce($4, '{}'::integer[]), coalesce($5, '{}'::timestamptz[]),
                  coalesce($7, '{}'::uuid[]))
           WITH ORDINALITY AS u(payload, kind, priority, run_at, id, n)
     WHERE u.payload IS NOT NULL
     ORDER BY u.n
    RETURNING sluice.jobs.id;
    PERFORM sluice.notify_ready($1, now());
END;
$$;
