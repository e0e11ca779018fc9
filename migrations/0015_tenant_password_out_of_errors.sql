-- Why: `sluice.ensure_tenant` builds `CREATE ROLE ... PASSWORD '<password>'` (or `ALTER ROLE`) and runs it
-- with EXECUTE. When that statement fails (the caller lacks CREATEROLE, the most common case when the
-- operator provisions tenants), PostgreSQL attaches the statement's text to the error as its context:
-- the password went to the server's log and back to the client in the error's `where` field. The
-- statement now runs in a block that raises the error again with its code, message, detail and hint
-- only, whose context is this function's line, not the statement. Nothing else changes.

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
BEGIN
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace = p_namespace AND t.role_name <> p_role) THEN
        RAISE EXCEPTION 'namespace "%" has a tenant role other than "%" already', p_namespace, p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role AND t.namespace <> p_namespace) THEN
        RAISE EXCEPTION 'role "%" is the tenant of another namespace; not moving it to "%"', p_role, p_namespace
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role)
       AND NOT EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role) THEN
        RAISE EXCEPTION 'role "%" exists and is no Sluice tenant; not taking it over', p_role
            USING ERRCODE = 'SL409';
    END IF;
    BEGIN
        EXECUTE format('%s ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                       CASE WHEN EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = p_role)
                            THEN 'ALTER' ELSE 'CREATE' END,
                       p_role, p_password);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT,
                                v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
        -- RAISE refuses a NULL option, and an empty one would show as an empty line.
        IF v_detail <> '' AND v_hint <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail, HINT = v_hint;
        ELSIF v_detail <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail;
        ELSIF v_hint <> '' THEN
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, HINT = v_hint;
        ELSE
            RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message;
        END IF;
    END;
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
