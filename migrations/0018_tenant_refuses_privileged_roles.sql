-- Why: `sluice.ensure_tenant` refused only unregistered roles, other namespaces' tenants and members of
-- other roles. A role registered in `sluice.tenants` by hand (a raw INSERT) could be any role: the
-- schema's owner, say. The operator would then set that role's password to the tenant's and hand it to
-- the namespace, whose workers would log in as the tables' owner, which row-level security does not
-- limit. The function now also refuses (SL409) a role that
--   - is the login calling it (`current_user` or `session_user`);
--   - owns anything in this database, or a database or tablespace of the server (`pg_shdepend`'s owner
--     entries; `pg_class`, `pg_namespace` and `pg_proc` looked at too, for objects of roles not
--     tracked there);
--   - is a superuser or has CREATEROLE, BYPASSRLS or REPLICATION (roles the function makes have none);
--   - has members other than the caller that can SET ROLE to it or inherit its rights (on PostgreSQL
--     16 and later, a CREATEROLE login that creates a role is made its member with ADMIN OPTION only,
--     neither SET nor INHERIT: that membership is no way into the tenant and is allowed).
-- No message carries the statement's text (the password's verifier), as in 0015. Everything else is
-- as in 0016.

CREATE OR REPLACE FUNCTION sluice.ensure_tenant(p_role text, p_namespace text, p_password text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
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
        EXECUTE format('%s ROLE %I WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS PASSWORD %L',
                       CASE WHEN v_oid IS NOT NULL THEN 'ALTER' ELSE 'CREATE' END,
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
