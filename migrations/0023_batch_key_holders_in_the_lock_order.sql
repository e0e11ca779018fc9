-- Why: a batch with keys (`enqueue_many`) enqueues its keyed jobs one by one in key order, and each
-- locks (or writes) its key's current holder as it comes: the holders were locked in the order of their
-- keys, not of their ids. With holders H1 of key "a" and H2 < H1 of key "b", a batch replacing both
-- locked H1, then H2, and crossed a transaction locking H2, then H1 (an enqueue naming both as parents,
-- or a heartbeat or finishing batch holding both while they run), which PostgreSQL aborted as a deadlock
-- (40P01) after `deadlock_timeout`.
--
-- Now the batch locks the current holders of all its unique and idempotency keys in one statement in id
-- order (`ORDER BY id FOR NO KEY UPDATE`) before its first job, as a graph does (migrations 0021, 0022).
-- The key order stays: it orders the inserts of new keys, which wait for a concurrent insert of the same
-- key rather than for a row lock. A holder that appears after the lock (a concurrent enqueue's) is not
-- covered; the store runs a batch PostgreSQL aborted as a deadlock once more.
--
-- Physical design: the function is replaced with the same signature; holders are looked up in the
-- unique-key and idempotency-key indexes and locked by primary key. Behaviour is otherwise that of
-- migration 0009.

-- As migration 0009, with the keys' holders locked in id order before the first job.
CREATE OR REPLACE FUNCTION sluice.enqueue_many(
    queue text,
    payloads jsonb[],
    kinds text[] DEFAULT ARRAY['default'],
    priorities integer[] DEFAULT NULL,
    run_ats timestamptz[] DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    ids uuid[] DEFAULT NULL,
    idempotency_keys text[] DEFAULT NULL,
    unique_keys text[] DEFAULT NULL,
    unique_modes text[] DEFAULT NULL,
    unique_fors interval[] DEFAULT NULL,
    debounces interval[] DEFAULT NULL
) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q      sluice.queues;
    v_out  uuid[];
    v_got  uuid;
    r      record;
BEGIN
    SELECT * INTO q FROM sluice.queues WHERE sluice.queues.name = $1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'queue "%" does not exist', $1 USING ERRCODE = 'SL404';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(coalesce($8, '{}')) k WHERE k IS NOT NULL)
       OR EXISTS (SELECT 1 FROM unnest(coalesce($9, '{}')) k WHERE k IS NOT NULL)
       OR EXISTS (SELECT 1 FROM unnest(coalesce($10, '{}')) k WHERE k IS NOT NULL)
       OR EXISTS (SELECT 1 FROM unnest(coalesce($11, '{}')) k WHERE k IS NOT NULL)
       OR EXISTS (SELECT 1 FROM unnest(coalesce($12, '{}')) k WHERE k IS NOT NULL) THEN
        v_out := array_fill(NULL::uuid, ARRAY[cardinality($2)]);
        -- The current holders of the batch's unique and idempotency keys, locked in one statement in id
        -- order before the first job: each job's own lock or write of its key's holder below is then a
        -- lock this call holds already, whatever order the keys sort in.
        PERFORM 1 FROM (
SELECT h.id
  FROM sluice.jobs h
 WHERE h.id = ANY (ARRAY(SELECT k.id FROM sluice.jobs k
                          WHERE k.queue = $1 AND k.unique_key = ANY ($9))
                   || ARRAY(SELECT k.id FROM sluice.jobs k
                             WHERE k.queue = $1 AND k.idempotency_key = ANY ($8)))
 ORDER BY h.id
   FOR NO KEY UPDATE
        ) locked;
        FOR r IN
            SELECT u.*
              FROM unnest($2, $3, coalesce($4, '{}'::integer[]), coalesce($5, '{}'::timestamptz[]),
                          coalesce($7, '{}'::uuid[]), coalesce($8, '{}'::text[]), coalesce($9, '{}'::text[]),
                          coalesce($10, '{}'::text[]), coalesce($11, '{}'::interval[]),
                          coalesce($12, '{}'::interval[]))
                   WITH ORDINALITY AS u(payload, kind, priority, run_at, id, ik, uk, um, uf, db, n)
             WHERE u.payload IS NOT NULL
             ORDER BY u.uk, u.ik, u.n
        LOOP
            SELECT e.id INTO v_got
              FROM sluice.enqueue_job($1, CASE WHEN cardinality($3) = 1 THEN $3[1] ELSE r.kind END,
                                      r.payload, coalesce(r.priority, 0), r.run_at, $6, r.ik, r.id, r.uk,
                                      r.um, r.uf, r.db) e;
            v_out[r.n] := v_got;
        END LOOP;
        RETURN QUERY SELECT o.x FROM unnest(v_out) WITH ORDINALITY AS o(x, n) WHERE o.x IS NOT NULL
                      ORDER BY o.n;
        RETURN;
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
