-- Why: a job often needs others to finish first (render the pages, then bind the book). A job can name
-- the jobs it depends on when it is enqueued; it waits in state `blocked`, not claimable and not counted
-- as demand, until every parent has succeeded, and is ready in the transaction that finishes the last
-- one (see docs/queue.md, "Job dependencies").
--
-- Physical design:
-- * `sluice.job_dependencies` holds one row per (child, parent) edge. `resolved` marks an edge whose
--   parent has finished (succeeded, dead or cancelled), so a parent that is retried after it died and
--   then succeeds does not release its children twice. The child's `blocked_by` counts its unresolved
--   edges; releasing a child is one decrement of its own row, which concurrent completions of two
--   parents serialise on (the second UPDATE waits for the first and re-reads the count).
-- * Children are released by a row trigger on `sluice.jobs`, after an UPDATE of `state` and only when
--   the job has dependents (`has_dependents`, set when a child names it): the worker's completion, lease
--   rescue and cancel statements need no change, the release commits with the completion, and every
--   other job pays only the trigger's WHEN test. Heartbeats do not update `state`, so they stay HOT and
--   never reach the trigger.
-- * The edge's child has a foreign key with ON DELETE CASCADE: retention deleting a finished job deletes
--   its edges (one primary-key probe per deleted job). Parents have none: a parent may be deleted by
--   retention long after its children were released, and the edge keeps its id.
-- * Blocked jobs are outside the claim index (it holds `pending` and `retrying` only); a partial index
--   of their own lets depth count them.
-- * Changing the state CHECK reads the table once, under the migration's lock (like 0003's index build).

ALTER TABLE sluice.jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE sluice.jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('blocked', 'pending', 'running', 'succeeded', 'retrying', 'dead', 'cancelled'));
-- `jobs_check3` is the name PostgreSQL gave 0001's "only a job that has run can be running, retrying,
-- succeeded or dead"; a blocked job has not run either.
ALTER TABLE sluice.jobs DROP CONSTRAINT jobs_check3;
ALTER TABLE sluice.jobs ADD CONSTRAINT jobs_ran_check
    CHECK (state IN ('blocked', 'pending', 'cancelled') OR attempt >= 1);

ALTER TABLE sluice.jobs
    -- Parents that have not finished yet.
    ADD COLUMN blocked_by integer NOT NULL DEFAULT 0 CHECK (blocked_by >= 0),
    -- What a parent that ends dead or cancelled does to this job: cancel it (NULL, the default) or run it.
    ADD COLUMN on_parent_failure text CHECK (on_parent_failure IN ('cancel', 'run')),
    -- Some job depends on this one.
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false;
ALTER TABLE sluice.jobs ADD CONSTRAINT jobs_blocked_check
    CHECK (state <> 'blocked' OR (blocked_by > 0 AND attempt = 0));

CREATE INDEX jobs_blocked_idx ON sluice.jobs (queue) WHERE state = 'blocked';

CREATE TABLE sluice.job_dependencies (
    job_id     uuid NOT NULL REFERENCES sluice.jobs (id) ON DELETE CASCADE,
    parent_id  uuid NOT NULL,
    resolved   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, parent_id)
);
CREATE INDEX job_dependencies_parent_idx ON sluice.job_dependencies (parent_id) WHERE NOT resolved;

-- Releases the children of a job that just finished: each loses one unresolved parent; a child whose
-- last parent succeeded becomes `pending` (ready now) and the queue is notified; a child whose parent
-- ended dead or cancelled is cancelled with a reason naming the parent, unless it said
-- `on_parent_failure = 'run'` (then that parent counts as finished). Cancelling a child fires this
-- trigger for the child's own children in turn.
CREATE FUNCTION sluice.release_dependents() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_failed  boolean := NEW.state <> 'succeeded';
    v_queue   text;
BEGIN
    FOR v_queue IN
        WITH edges AS (
            UPDATE sluice.job_dependencies d SET resolved = true
             WHERE d.parent_id = NEW.id AND NOT d.resolved
            RETURNING d.job_id
        ), released AS (
            UPDATE sluice.jobs c
               SET state = CASE
                       WHEN v_failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN 'cancelled'
                       WHEN c.blocked_by = 1 THEN 'pending'
                       ELSE 'blocked'
                   END,
                   blocked_by = CASE
                       WHEN v_failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN 0
                       ELSE c.blocked_by - 1
                   END,
                   finished_at = CASE
                       WHEN v_failed AND c.on_parent_failure IS DISTINCT FROM 'run' THEN now()
                   END,
                   last_error = CASE
                       WHEN v_failed AND c.on_parent_failure IS DISTINCT FROM 'run'
                       THEN format('cancelled: parent job %s is %s', NEW.id, NEW.state)
                       ELSE c.last_error
                   END,
                   run_at = CASE WHEN c.blocked_by = 1 THEN greatest(c.run_at, now()) ELSE c.run_at END
              FROM edges e
             WHERE c.id = e.job_id AND c.state = 'blocked'
            RETURNING c.queue, c.state
        )
        SELECT DISTINCT r.queue FROM released r WHERE r.state = 'pending'
    LOOP
        PERFORM sluice.notify_ready(v_queue, now());
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_release_dependents
    AFTER UPDATE OF state ON sluice.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('succeeded', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION sluice.release_dependents();

DROP FUNCTION sluice.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text, interval,
                             interval);
DROP FUNCTION sluice.enqueue_job(text, text, jsonb, integer, timestamptz, integer, text, uuid, text, text,
                                 interval, interval);

-- Enqueues one job and says whether it was created. Idempotency and unique keys: as in migration 0004.
--
-- Dependencies (`p_depends_on`, job ids of any queue, at most 1000): the parents are locked, so a parent
-- finishing meanwhile either finishes before (and is seen finished here) or after (and releases this job).
-- Parents that succeeded count as done; one that is dead or cancelled cancels the job at once, naming it,
-- unless `p_on_parent_failure` is 'run'; the rest make the job `blocked` until they finish. An unknown
-- parent id raises 22023 naming it. Dependencies cannot be combined with a unique key.
CREATE FUNCTION sluice.enqueue_job(
    p_queue text,
    p_kind text,
    p_payload jsonb,
    p_priority integer DEFAULT 0,
    p_run_at timestamptz DEFAULT NULL,
    p_max_attempts integer DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_id uuid DEFAULT NULL,
    p_unique_key text DEFAULT NULL,
    p_unique_mode text DEFAULT NULL,
    p_unique_for interval DEFAULT NULL,
    p_debounce interval DEFAULT NULL,
    p_depends_on uuid[] DEFAULT NULL,
    p_on_parent_failure text DEFAULT NULL
) RETURNS TABLE (id uuid, created boolean)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    q           sluice.queues;
    v_id        uuid := coalesce(p_id, sluice.uuid_v7());
    v_hash      bytea;
    v_old       sluice.jobs;
    v_tries     integer := 0;
    v_mode      text;
    v_run_at    timestamptz := coalesce(p_run_at, now());
    v_for_ms    bigint;
    v_parents   uuid[];
    v_missing   uuid;
    v_open      uuid[];
    v_failed    sluice.jobs;
    v_state     text := 'pending';
    v_error     text;
BEGIN
    SELECT * INTO q FROM sluice.queues WHERE sluice.queues.name = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', p_queue USING ERRCODE = 'SL404';
    END IF;

    IF p_unique_key IS NULL THEN
        IF p_unique_mode IS NOT NULL OR p_unique_for IS NOT NULL OR p_debounce IS NOT NULL THEN
            RAISE EXCEPTION 'unique_mode, unique_for and debounce need a unique_key' USING ERRCODE = '22023';
        END IF;
    ELSE
        v_mode := coalesce(p_unique_mode, CASE WHEN p_debounce IS NOT NULL THEN 'debounce' ELSE 'preserve' END);
        IF v_mode NOT IN ('preserve', 'replace', 'debounce') THEN
            RAISE EXCEPTION 'unique_mode "%": use preserve, replace or debounce', v_mode USING ERRCODE = '22023';
        END IF;
        IF (v_mode = 'debounce') <> (p_debounce IS NOT NULL) THEN
            RAISE EXCEPTION 'debounce: give it exactly when unique_mode is debounce' USING ERRCODE = '22023';
        END IF;
        IF p_debounce < interval '0' OR p_unique_for < interval '0' THEN
            RAISE EXCEPTION 'debounce and unique_for must not be negative' USING ERRCODE = '22023';
        END IF;
        IF v_mode = 'debounce' AND p_run_at IS NOT NULL THEN
            RAISE EXCEPTION 'run_at: not with debounce, which sets the run time itself' USING ERRCODE = '22023';
        END IF;
        IF p_idempotency_key IS NOT NULL THEN
            RAISE EXCEPTION 'idempotency_key and unique_key cannot be combined: use one of them'
                USING ERRCODE = '22023';
        END IF;
        IF v_mode = 'debounce' THEN
            v_run_at := now() + p_debounce;
        END IF;
        v_for_ms := (extract(epoch FROM p_unique_for) * 1000)::bigint;
    END IF;

    IF p_on_parent_failure IS NOT NULL AND p_on_parent_failure NOT IN ('cancel', 'run') THEN
        RAISE EXCEPTION 'on_parent_failure "%": use cancel or run', p_on_parent_failure USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_depends_on) > 0 THEN
        IF p_unique_key IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on and unique_key cannot be combined' USING ERRCODE = '22023';
        END IF;
        SELECT array_agg(DISTINCT x) INTO v_parents FROM unnest(p_depends_on) x;
        IF array_position(v_parents, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on: job ids must not be null' USING ERRCODE = '22023';
        END IF;
        IF cardinality(v_parents) > 1000 THEN
            RAISE EXCEPTION 'depends_on: at most 1000 parents' USING ERRCODE = '22023';
        END IF;
        -- Lock the parents in id order (no deadlock between two enqueues naming the same parents): a
        -- completion of one of them waits for this transaction, then releases this job.
        PERFORM 1 FROM (SELECT j.id FROM sluice.jobs j WHERE j.id = ANY (v_parents) ORDER BY j.id
                          FOR NO KEY UPDATE) locked;
        SELECT x INTO v_missing FROM unnest(v_parents) x
         WHERE NOT EXISTS (SELECT 1 FROM sluice.jobs j WHERE j.id = x) LIMIT 1;
        IF v_missing IS NOT NULL THEN
            RAISE EXCEPTION 'depends_on: job % does not exist', v_missing USING ERRCODE = '22023';
        END IF;
        SELECT array_agg(j.id) INTO v_open FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state NOT IN ('succeeded', 'dead', 'cancelled');
        SELECT * INTO v_failed FROM sluice.jobs j
         WHERE j.id = ANY (v_parents) AND j.state IN ('dead', 'cancelled') ORDER BY j.id LIMIT 1;
        IF v_failed.id IS NOT NULL AND p_on_parent_failure IS DISTINCT FROM 'run' THEN
            v_state := 'cancelled';
            v_error := format('cancelled: parent job %s is %s', v_failed.id, v_failed.state);
        ELSIF cardinality(v_open) > 0 THEN
            v_state := 'blocked';
        END IF;
    END IF;

    IF p_unique_key IS NOT NULL THEN
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'unique key "%" is contended', p_unique_key USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     unique_key, unique_for_ms)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_unique_key, v_for_ms)
            ON CONFLICT (queue, unique_key) WHERE unique_key IS NOT NULL DO NOTHING;
            EXIT WHEN FOUND;
            SELECT * INTO v_old FROM sluice.jobs j
             WHERE j.queue = p_queue AND j.unique_key = p_unique_key
               FOR UPDATE;
            CONTINUE WHEN NOT FOUND; -- the holder was deleted or gave the key up meanwhile: try again
            IF v_old.state IN ('dead', 'cancelled')
               OR (v_old.state = 'succeeded'
                   AND (v_old.unique_for_ms IS NULL
                        OR v_old.finished_at + v_old.unique_for_ms * interval '1 millisecond' <= now()))
               OR (v_old.state = 'running' AND v_mode <> 'preserve') THEN
                UPDATE sluice.jobs j SET unique_key = NULL WHERE j.id = v_old.id;
                CONTINUE;
            END IF;
            IF v_old.state IN ('succeeded', 'running') OR v_mode = 'preserve' THEN
                id := v_old.id;
                created := false;
                RETURN NEXT;
                RETURN;
            END IF;
            UPDATE sluice.jobs j
               SET kind = p_kind,
                   payload = p_payload,
                   priority = p_priority,
                   run_at = v_run_at,
                   max_attempts = greatest(coalesce(p_max_attempts, q.max_attempts), j.attempt, 1),
                   unique_for_ms = v_for_ms
             WHERE j.id = v_old.id;
            PERFORM sluice.notify_ready(p_queue, v_run_at);
            id := v_old.id;
            created := false;
            RETURN NEXT;
            RETURN;
        END LOOP;
    ELSIF p_idempotency_key IS NULL THEN
        INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at, state, blocked_by,
                                 on_parent_failure, finished_at, last_error)
        VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                v_run_at, v_state, CASE WHEN v_state = 'blocked' THEN cardinality(v_open) ELSE 0 END,
                p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error);
    ELSE
        v_hash := sha256(convert_to(p_kind || E'\n' || p_payload::text, 'UTF8'));
        LOOP
            v_tries := v_tries + 1;
            IF v_tries > 10 THEN
                RAISE EXCEPTION 'idempotency key "%" is contended', p_idempotency_key
                    USING ERRCODE = '40001';
            END IF;
            INSERT INTO sluice.jobs (id, queue, kind, payload, priority, max_attempts, run_at,
                                     idempotency_key, payload_hash, state, blocked_by, on_parent_failure,
                                     finished_at, last_error)
            VALUES (v_id, p_queue, p_kind, p_payload, p_priority, coalesce(p_max_attempts, q.max_attempts),
                    v_run_at, p_idempotency_key, v_hash, v_state,
                    CASE WHEN v_state = 'blocked' THEN cardinality(v_open) ELSE 0 END,
                    p_on_parent_failure, CASE WHEN v_state = 'cancelled' THEN now() END, v_error)
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
    IF v_parents IS NOT NULL THEN
        INSERT INTO sluice.job_dependencies (job_id, parent_id, resolved)
        SELECT v_id, p, NOT (p = ANY (coalesce(v_open, '{}'))) FROM unnest(v_parents) p;
        UPDATE sluice.jobs j SET has_dependents = true WHERE j.id = ANY (v_open) AND NOT j.has_dependents;
    END IF;
    IF v_state = 'pending' THEN
        PERFORM sluice.notify_ready(p_queue, v_run_at);
    END IF;
    id := v_id;
    created := true;
    RETURN NEXT;
END;
$$;

-- Enqueues one job and returns its id (see enqueue_job for idempotency keys, unique keys and
-- dependencies).
--   SELECT sluice.enqueue('books', '{"book": 7}', kind => 'bind', depends_on => ARRAY[a, b]);
CREATE FUNCTION sluice.enqueue(
    queue text,
    payload jsonb,
    kind text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    unique_key text DEFAULT NULL,
    unique_mode text DEFAULT NULL,
    unique_for interval DEFAULT NULL,
    debounce interval DEFAULT NULL,
    depends_on uuid[] DEFAULT NULL,
    on_parent_failure text DEFAULT NULL
) RETURNS uuid
LANGUAGE sql VOLATILE AS $$
    SELECT e.id FROM sluice.enqueue_job($1, $3, $2, $4, $5, $6, $7, NULL, $8, $9, $10, $11, $12, $13) e
$$;

-- Enqueues a small graph of jobs (at most 100) in one call, all or nothing. `jobs` is a JSON array of
-- objects: {"ref": "...", "kind": "...", "payload": ..., "priority": 0, "runAt": "...", "maxAttempts": n,
-- "dependsOn": ["ref or job id", ...], "onParentFailure": "cancel" | "run"}. `ref` is the caller's name
-- for a job, unique within the call; `dependsOn` names other jobs of the call by ref, or existing jobs
-- by id. Parents are enqueued before their children. A cycle, a duplicate or unknown ref, or an unknown
-- job id raises 22023 naming it, and nothing is enqueued. Returns (ref, id) in input order.
CREATE FUNCTION sluice.enqueue_graph(queue text, jobs jsonb)
RETURNS TABLE (ref text, id uuid)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    n        integer;
    refs     text[] := '{}';
    ids      uuid[] := '{}';
    done     boolean[] := '{}';
    left_    integer;
    progress boolean;
    i        integer;
    j        jsonb;
    dep      text;
    deps     uuid[];
    ready    boolean;
    k        integer;
    v_queue  text := queue;
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' OR jsonb_array_length(jobs) = 0 THEN
        RAISE EXCEPTION 'jobs: must be a non-empty JSON array' USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(jobs);
    IF n > 100 THEN
        RAISE EXCEPTION 'jobs: % jobs is over the graph limit of 100', n USING ERRCODE = '22023';
    END IF;
    FOR i IN 1..n LOOP
        j := jobs -> (i - 1);
        IF jsonb_typeof(j -> 'ref') IS DISTINCT FROM 'string' OR length(j ->> 'ref') = 0 THEN
            RAISE EXCEPTION 'jobs[%].ref: required, a non-empty string', i - 1 USING ERRCODE = '22023';
        END IF;
        IF (j ->> 'ref') = ANY (refs) THEN
            RAISE EXCEPTION 'jobs[%].ref: "%" is used twice', i - 1, j ->> 'ref' USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(coalesce(j -> 'dependsOn', '[]')) <> 'array' THEN
            RAISE EXCEPTION 'jobs[%].dependsOn: must be an array', i - 1 USING ERRCODE = '22023';
        END IF;
        refs := refs || (j ->> 'ref');
        ids := ids || sluice.uuid_v7();
        done := done || false;
    END LOOP;
    -- Every dependency is a ref of this call or a job id.
    FOR i IN 1..n LOOP
        FOR dep IN SELECT jsonb_array_elements_text(coalesce(jobs -> (i - 1) -> 'dependsOn', '[]')) LOOP
            IF NOT dep = ANY (refs) AND dep !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$' THEN
                RAISE EXCEPTION 'jobs[%].dependsOn: "%" is neither a ref of this call nor a job id', i - 1, dep
                    USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END LOOP;
    -- Parents first: each round enqueues every job whose refs are all enqueued; a round that enqueues
    -- nothing while jobs are left means a cycle.
    left_ := n;
    WHILE left_ > 0 LOOP
        progress := false;
        FOR i IN 1..n LOOP
            CONTINUE WHEN done[i];
            j := jobs -> (i - 1);
            ready := true;
            deps := '{}';
            FOR dep IN SELECT jsonb_array_elements_text(coalesce(j -> 'dependsOn', '[]')) LOOP
                k := array_position(refs, dep);
                IF k IS NULL THEN
                    deps := deps || dep::uuid;
                ELSIF done[k] THEN
                    deps := deps || ids[k];
                ELSE
                    ready := false;
                    EXIT;
                END IF;
            END LOOP;
            CONTINUE WHEN NOT ready;
            PERFORM sluice.enqueue_job(
                v_queue, coalesce(j ->> 'kind', 'default'), coalesce(j -> 'payload', 'null'),
                coalesce((j ->> 'priority')::integer, 0), (j ->> 'runAt')::timestamptz,
                (j ->> 'maxAttempts')::integer, NULL, ids[i],
                p_depends_on => deps, p_on_parent_failure => j ->> 'onParentFailure');
            done[i] := true;
            left_ := left_ - 1;
            progress := true;
        END LOOP;
        IF NOT progress THEN
            RAISE EXCEPTION 'jobs: the dependencies of % form a cycle',
                (SELECT string_agg(format('"%s"', refs[x]), ', ' ORDER BY x)
                   FROM generate_subscripts(refs, 1) x WHERE NOT done[x])
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN QUERY SELECT refs[x], ids[x] FROM generate_subscripts(refs, 1) x ORDER BY x;
END;
$$;
