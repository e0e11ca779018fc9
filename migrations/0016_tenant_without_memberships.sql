-- Why: `sluice.ensure_tenant` adopted an existing tenant role whatever roles it was a member of. A
-- member of another role can `SET ROLE` to it (with INHERIT or not, given SET on the grant), and the
-- policies limit `current_user` only: a tenant granted membership in the owner, or in any role the
-- tables are granted to, would step out of row-level security on its own connection. The function now
-- refuses (SL409, naming the memberships) a role that is a member of any role; the roles it creates
-- have none. Everything else is as in 0015.

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
    v_memberships text;
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
    SELECT string_agg(quote_ident(g.rolname), ', ' ORDER BY g.rolname) INTO v_memberships
    FROM pg_auth_members m
    JOIN pg_roles r ON r.oid = m.member
    JOIN pg_roles g ON g.oid = m.roleid
    WHERE r.rolname = p_role;
    IF v_memberships IS NOT NULL THEN
        RAISE EXCEPTION 'role "%" is a member of %; a tenant could SET ROLE out of row-level security: revoke the membership first (REVOKE % FROM %)',
                        p_role, v_memberships, v_memberships, quote_ident(p_role)
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
