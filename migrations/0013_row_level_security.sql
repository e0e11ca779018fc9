-- Why: queues of many namespaces share one database, and a worker's SQL connection must not reach
-- another namespace's jobs. Each namespace gets a LOGIN role of its own (a "tenant"), and row-level
-- security limits a tenant to the rows of its namespace's queues (`<namespace>/...`): it cannot read,
-- claim, complete, cancel, insert or move another namespace's jobs, queues, schedules or dependency
-- edges, whatever SQL it sends. Workers log in as the tenant (a `SET ROLE` from a privileged login would
-- not do: `RESET ROLE` escapes it).
--
-- * Only registered tenants (rows of `sluice.tenants`) are limited. The owner of the tables (the login
--   that runs these migrations: the operator's) bypasses RLS as owners do, and must: it registers
--   queues, reads depth and leases of every namespace. FORCE ROW LEVEL SECURITY is therefore not set;
--   other roles the database admin granted the tables to keep what their grants give them.
-- * No function here is SECURITY DEFINER: enqueue, claim and the dependency trigger run as the caller,
--   so RLS applies inside them. A tenant's enqueue into another namespace's queue finds no queue
--   (SL404), and a dependency on another namespace's job reads as an unknown id. The trigger that
--   releases or cancels children sees the tenant's own jobs, which are all the children it may have.
-- * The policies compare with `(SELECT sluice.tenant_prefix())`, an uncorrelated subquery evaluated once
--   per statement, so a claim or completion pays one lookup, not one per row.

CREATE TABLE sluice.tenants (
    role_name  text PRIMARY KEY,
    namespace  text NOT NULL UNIQUE CHECK (namespace ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE sluice.tenants ENABLE ROW LEVEL SECURITY;
-- Each role sees its own row only (if any): how `tenant_prefix` knows whether the caller is a tenant.
CREATE POLICY tenants_own_row ON sluice.tenants FOR SELECT USING (role_name = current_user);
GRANT SELECT ON sluice.tenants TO PUBLIC;

-- The prefix of the caller's queues (`shop/`) when the caller is a tenant; '' (every queue) otherwise.
CREATE FUNCTION sluice.tenant_prefix() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT t.namespace || '/' FROM sluice.tenants t WHERE t.role_name = current_user), '')
$$;

ALTER TABLE sluice.jobs ENABLE ROW LEVEL SECURITY;
CREATE POLICY jobs_tenant ON sluice.jobs
    USING (starts_with(queue, (SELECT sluice.tenant_prefix())))
    WITH CHECK (starts_with(queue, (SELECT sluice.tenant_prefix())));

ALTER TABLE sluice.queues ENABLE ROW LEVEL SECURITY;
CREATE POLICY queues_tenant ON sluice.queues
    USING (starts_with(name, (SELECT sluice.tenant_prefix())))
    WITH CHECK (starts_with(name, (SELECT sluice.tenant_prefix())));

ALTER TABLE sluice.schedules ENABLE ROW LEVEL SECURITY;
CREATE POLICY schedules_tenant ON sluice.schedules
    USING (starts_with(queue, (SELECT sluice.tenant_prefix())))
    WITH CHECK (starts_with(queue, (SELECT sluice.tenant_prefix())));

-- Event subscriptions (the sidecars' SSE streams, migration 0011) are per queue too. An expired row of
-- another namespace is left to that namespace's sidecars (it no longer counts either way).
ALTER TABLE sluice.event_subscriptions ENABLE ROW LEVEL SECURITY;
CREATE POLICY event_subscriptions_tenant ON sluice.event_subscriptions
    USING (starts_with(queue, (SELECT sluice.tenant_prefix())))
    WITH CHECK (starts_with(queue, (SELECT sluice.tenant_prefix())));

-- An edge belongs to its child job: a tenant sees and writes the edges of its own jobs (the subquery on
-- sluice.jobs is itself limited by that table's policy).
ALTER TABLE sluice.job_dependencies ENABLE ROW LEVEL SECURITY;
CREATE POLICY job_dependencies_tenant ON sluice.job_dependencies
    USING ((SELECT sluice.tenant_prefix()) = ''
           OR EXISTS (SELECT 1 FROM sluice.jobs j WHERE j.id = job_dependencies.job_id))
    WITH CHECK ((SELECT sluice.tenant_prefix()) = ''
                OR EXISTS (SELECT 1 FROM sluice.jobs j WHERE j.id = job_dependencies.job_id));

-- Creates (or updates the password of) the LOGIN role `p_role` for namespace `p_namespace`, registers it
-- as a tenant and grants it what workers and the queue API need: the schema, the queue tables (rows of
-- its namespace only, by the policies above), reading the migrations' bookkeeping (so a worker finds
-- the schema current and migrates nothing) and connecting to this database. Runs as the caller, who
-- needs CREATEROLE and to own the tables (the login that ran these migrations). Idempotent.
CREATE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace = p_namespace AND t.role_name <> p_role) THEN
        RAISE EXCEPTION 'namespace "%" has a tenant role other than "%" already', p_namespace, p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role) THEN
        IF NOT EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role) THEN
            RAISE EXCEPTION 'role "%" exists and is no Sluice tenant; not taking it over', p_role
                USING ERRCODE = 'SL409';
        END IF;
        EXECUTE format('ALTER ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                       p_role, p_password);
    ELSE
        EXECUTE format('CREATE ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                       p_role, p_password);
    END IF;
    INSERT INTO sluice.tenants (role_name, namespace) VALUES (p_role, p_namespace)
    ON CONFLICT (role_name) DO NOTHING;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), p_role);
    EXECUTE format('GRANT USAGE ON SCHEMA sluice TO %I', p_role);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON sluice.jobs, sluice.queues, sluice.schedules, '
                   'sluice.job_dependencies, sluice.event_subscriptions TO %I', p_role);
    EXECUTE format('GRANT SELECT ON sluice._sqlx_migrations, sluice.tenants TO %I', p_role);
END;
$$;
