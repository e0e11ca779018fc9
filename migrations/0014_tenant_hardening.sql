-- Why: three ways around 0012/0013's tenancy, found by review and closed here.
--
-- 1. `sluice.tenant_prefix()`, which every policy calls, is an SQL function whose body is parsed when it
--    runs, under the caller's `search_path`. A tenant allowed to create objects in any schema (`public`
--    on PostgreSQL 14 and older, by default) could define its own `||` operator there, put that schema
--    first and make its prefix '' — every namespace's rows. The function now runs with a fixed
--    `search_path` (pg_catalog, then nothing the caller controls).
-- 2. `sluice.adopt_queue` could be run by any role. It runs as its caller, so row-level security still
--    applied, but it locks `sluice.jobs` (SHARE ROW EXCLUSIVE): a tenant holding that lock in an open
--    transaction would stall enqueues, claims and completions of every namespace. Only the owner (the
--    operator's login) adopts queues; likewise only the owner creates tenants.
-- 3. `ensure_tenant(<a's role>, 'b', ...)` reset a's password and answered success while the role stayed
--    a's tenant. A role that is the tenant of another namespace is now refused (SL409), as a namespace
--    that has another role already was.

ALTER FUNCTION sluice.tenant_prefix() SET search_path = pg_catalog, pg_temp;

REVOKE EXECUTE ON FUNCTION sluice.adopt_queue(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace = p_namespace AND t.role_name <> p_role) THEN
        RAISE EXCEPTION 'namespace "%" has a tenant role other than "%" already', p_namespace, p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role AND t.namespace <> p_namespace) THEN
        RAISE EXCEPTION 'role "%" is the tenant of another namespace; not moving it to "%"', p_role, p_namespace
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

REVOKE EXECUTE ON FUNCTION sluice.ensure_tenant(text, text, text) FROM PUBLIC;
