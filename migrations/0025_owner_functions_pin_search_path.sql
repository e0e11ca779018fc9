-- Why: most functions in `sluice` ran under their caller's `search_path`. PostgreSQL searches pg_catalog
-- first, but a function or operator elsewhere on the path whose argument types match a call better than
-- the built-in one still wins: `sluice.ensure_tenant` calls `format` with `(unknown, text, text)`
-- arguments, and a `public.format(text, text, text)` is a better match than
-- `pg_catalog.format(text, VARIADIC "any")`. A tenant role that may create objects in `public` (the
-- default before PostgreSQL 15, kept by pg_upgrade) could define one; the next time the operator
-- provisioned another namespace, that function ran as the schema's owner and could grant the owner's
-- role to the tenant or drop the row-level security policies: every namespace's jobs. Migration 0014
-- closed this class of attack for `sluice.tenant_prefix` only. The enqueue paths (run by the operator,
-- by apps and by tenants), `sluice.create_queue`, `sluice.adopt_queue`, `sluice.uuid_v7` and the trigger
-- functions (run by whoever changes a job) were open the same way.
--
-- What: every function in `sluice` that had no pinned `search_path` now runs with
-- `search_path = pg_catalog, pg_temp`, as `sluice.tenant_prefix`, `sluice.finish_jobs`,
-- `sluice.rescue_expired` and `sluice.job_cascade` do already: names the
-- caller's `search_path` brings in (`public` or any other schema) no longer resolve in their bodies,
-- and `pg_temp`, last, cannot shadow a relation of pg_catalog. Every body names `sluice`'s tables,
-- types and functions with their schema, and uses nothing outside pg_catalog and `sluice`, so none
-- needed a change and none is left out. None of them is SECURITY DEFINER: they still run with their
-- caller's rights. A trigger of one's own on `sluice`'s tables, fired from these functions, runs under
-- the same pinned path and must name what it uses outside pg_catalog with its schema.
--
-- Physical design: `ALTER FUNCTION ... SET search_path` only; no body, signature or grant changes.
-- A function with a `SET` clause is called through PostgreSQL's configuration-saving wrapper and an SQL
-- function so pinned is no longer inlined: `sluice.uuid_v7` costs about 5 microseconds a call instead
-- of 3 (200,000 calls in one statement), once per job enqueued, beside the ~130 microseconds of an
-- enqueue; the other functions are called once per statement.

ALTER FUNCTION sluice.uuid_v7() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.create_queue(text, integer, bigint, bigint, double precision, bigint, bigint, bigint, bigint)
    SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.adopt_queue(text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.ensure_tenant(text, text, text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.enqueue(text, jsonb, text, integer, timestamptz, integer, text, text, text, interval, interval,
                              uuid[], text)
    SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.enqueue_job(text, text, jsonb, integer, timestamptz, integer, text, uuid, text, text, interval,
                                  interval, uuid[], text)
    SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.enqueue_many(text, jsonb[], text[], integer[], timestamptz[], integer, uuid[], text[], text[],
                                   text[], interval[], interval[])
    SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.enqueue_graph(text, jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.notify_ready(text, timestamptz) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.notify_job_events() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION sluice.release_dependents() SET search_path = pg_catalog, pg_temp;
