-- Why: `sluice.ensure_tenant` altered an existing tenant role (setting the password the operator passes,
-- which it does whenever it provisions a namespace again: a new tenant Secret, an operator that
-- restarted) naming NOSUPERUSER, NOREPLICATION and NOBYPASSRLS. PostgreSQL lets only a superuser name
-- those attributes at all, even to leave them as they are ("must be superuser to alter superuser roles
-- or change superuser attribute"), so for a schema owner that is a CREATEROLE login and no superuser (as
-- the docs advise, and the rule on managed PostgreSQL services) every provisioning of an existing
-- tenant failed: the JobQueue was `Degraded`, `TenantNotProvisioned`, and the password never changed.
--
-- What: an existing role is altered naming only what a CREATEROLE login may change: LOGIN, NOINHERIT,
-- the password, and NOCREATEDB only when the role has CREATEDB. The checks before it (migration 0018)
-- already refuse a role that is a superuser or has CREATEROLE, BYPASSRLS or REPLICATION, so the
-- attributes no longer named cannot be set on a role that reaches the ALTER. A new role is created as
-- before, every attribute named.
--
-- Physical design: the function is replaced with the same signature, its body that of migration 0018
-- but for that statement, its `search_path` pinned as migration 0025 pinned it (a replaced function
-- keeps no `SET` clause it is not given again), EXECUTE the owner's alone.

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
    v_hint text;
    v_memberships text;
    v_members text;
    v_oid oid;
BEGIN
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.namespace = p_namespace AND t.role_name <> p_role) THEN
        RAISE EXCEPTION 'namespace "%" has a tenant role other than "%" already', p_namespace, p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role AND t.namespace <> p_namespace) THEN
        RAISE EXCEPTION 'role "%" is the tenant of another namespace; not moving it to "%"', p_role, p_namespace
            USING ERRCODE = 'SL409';
    END IF;
    IF p_role = current_user OR p_role = session_user THEN
        RAISE EXCEPTION 'role "%" is the login making tenants; a tenant must be a role of its own', p_role
            USING ERRCODE = 'SL409';
    END IF;
    SELECT r.oid INTO v_oid FROM pg_roles r WHERE r.rolname = p_role;
    IF v_oid IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM sluice.tenants t WHERE t.role_name = p_role) THEN
        RAISE EXCEPTION 'role "%" exists and is no Sluice tenant; not taking it over', p_role
            USING ERRCODE = 'SL409';
    END IF;
    IF v_oid IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_roles r
                   WHERE r.oid = v_oid
                     AND (r.rolsuper OR r.rolcreaterole OR r.rolbypassrls OR r.rolreplication)) THEN
            RAISE EXCEPTION 'role "%" is a superuser or has CREATEROLE, BYPASSRLS or REPLICATION; a tenant has none of them: register a role of its own for the namespace', p_role
                USING ERRCODE = 'SL409';
        END IF;
        IF EXISTS (SELECT 1 FROM pg_shdepend d
                   WHERE d.refclassid = 'pg_authid'::regclass AND d.refobjid = v_oid AND d.deptype = 'o'
                     AND d.dbid IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())))
           OR EXISTS (SELECT 1 FROM pg_class c WHERE c.relowner = v_oid)
           OR EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspowner = v_oid)
           OR EXISTS (SELECT 1 FROM pg_proc p WHERE p.proowner = v_oid) THEN
            RAISE EXCEPTION 'role "%" owns objects (see \dp, \dn and \df, or pg_shdepend); the owner of a table is not limited by row-level security: register a role of its own for the namespace', p_role
                USING ERRCODE = 'SL409';
        END IF;
        -- PostgreSQL 16 records whether a member may SET ROLE to the role and inherits its rights; in
        -- older releases every member may SET ROLE (the columns are absent: NULL, counted as may).
        SELECT string_agg(quote_ident(r.rolname), ', ' ORDER BY r.rolname) INTO v_members
        FROM pg_auth_members m
        JOIN pg_roles r ON r.oid = m.member
        WHERE m.roleid = v_oid
          AND r.rolname <> current_user
          AND ((to_jsonb(m) ->> 'set_option')::boolean IS NOT FALSE
               OR (to_jsonb(m) ->> 'inherit_option')::boolean IS NOT FALSE);
        IF v_members IS NOT NULL THEN
            RAISE EXCEPTION 'role "%" has members (%) that could act as the tenant: revoke the membership first (REVOKE % FROM %)',
                            p_role, v_members, quote_ident(p_role), v_members
                USING ERRCODE = 'SL409';
        END IF;
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
        -- An existing role (checked above to be neither superuser nor CREATEROLE, BYPASSRLS or
        -- REPLICATION) is altered naming only what a CREATEROLE login may change; naming NOSUPERUSER,
        -- NOREPLICATION or NOBYPASSRLS at all needs a superuser.
        IF v_oid IS NOT NULL THEN
            EXECUTE format('ALTER ROLE %I WITH LOGIN NOINHERIT%s PASSWORD %L',
                           p_role,
                           CASE WHEN (SELECT r.rolcreatedb FROM pg_roles r WHERE r.oid = v_oid)
                                THEN ' NOCREATEDB' ELSE '' END,
                           p_password);
        ELSE
            EXECUTE format('CREATE ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                           p_role, p_password);
        END IF;
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
