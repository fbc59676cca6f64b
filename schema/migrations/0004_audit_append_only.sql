-- The audit log made to hold: a per-tenant hash chain set by an insert trigger, triggers refusing UPDATE/DELETE/TRUNCATE,
-- and the role `agentvm_app` the application runs as (no UPDATE/DELETE on audit_log, only SELECT on audit_chain_heads).
-- Hand-written (a drizzle custom migration). The canonical row encoding is restated in schema/audit-hash.ts, which the
-- verifier computes independently of this SQL: change both together, and bump the version tag.

-- One row's hash: hex(sha256(prev_hash || canonical row)). The canonical row is the tag `agentvm-audit-v1`, then each
-- field as `<octet length>:<UTF-8 text>` or `~` for null, in this order: id, seq, chain ('' = no tenant), at as epoch
-- microseconds, actor, action, target, request_id, detail as jsonb text. No part depends on session settings (TimeZone,
-- DateStyle, extra_float_digits): the instant is an integer, jsonb's text form is canonical.
CREATE OR REPLACE FUNCTION audit_field(v text) RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $$
  SELECT octet_length(convert_to(v, 'UTF8'))::text || ':' || v
$$;
--> statement-breakpoint
CREATE OR REPLACE FUNCTION audit_row_hash(prev_hash text, id bigint, seq bigint, chain text, at timestamptz, actor text, action text, target text, request_id text, detail jsonb)
RETURNS text LANGUAGE sql STABLE AS $$
  SELECT encode(sha256(convert_to(
    prev_hash || 'agentvm-audit-v1'
      || coalesce(audit_field(id::text), '~')
      || coalesce(audit_field(seq::text), '~')
      || coalesce(audit_field(chain), '~')
      || coalesce(audit_field(trunc(extract(epoch FROM at) * 1000000)::bigint::text), '~')
      || coalesce(audit_field(actor), '~')
      || coalesce(audit_field(action), '~')
      || coalesce(audit_field(target), '~')
      || coalesce(audit_field(request_id), '~')
      || coalesce(audit_field(detail::text), '~'),
    'UTF8')), 'hex')
$$;
--> statement-breakpoint
-- Existing rows: their chains, in id order per tenant (before the triggers below exist: this is the only UPDATE ever).
DO $$
DECLARE
  r record;
  cur_chain text := NULL;
  cur_seq bigint := 0;
  cur_hash text := '';
  h text;
BEGIN
  FOR r IN SELECT * FROM audit_log ORDER BY coalesce(tenant_id, ''), id LOOP
    IF cur_chain IS DISTINCT FROM coalesce(r.tenant_id, '') THEN
      IF cur_chain IS NOT NULL THEN
        INSERT INTO audit_chain_heads (chain, seq, hash) VALUES (cur_chain, cur_seq, cur_hash)
          ON CONFLICT (chain) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash;
      END IF;
      cur_chain := coalesce(r.tenant_id, '');
      cur_seq := 0;
      cur_hash := '';
    END IF;
    cur_seq := cur_seq + 1;
    h := audit_row_hash(cur_hash, r.id, cur_seq, cur_chain, r.at, r.actor, r.action, r.target, r.request_id, r.detail);
    UPDATE audit_log SET seq = cur_seq, prev_hash = cur_hash, hash = h WHERE id = r.id;
    cur_hash := h;
  END LOOP;
  IF cur_chain IS NOT NULL THEN
    INSERT INTO audit_chain_heads (chain, seq, hash) VALUES (cur_chain, cur_seq, cur_hash)
      ON CONFLICT (chain) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash;
  END IF;
END
$$;
--> statement-breakpoint
-- Each insert advances its chain's head. The upsert takes the head's row lock (held to commit), so writers of one chain
-- queue there, and under READ COMMITTED the waiting one re-reads the head the first committed: seq has no gaps or
-- duplicates, prev_hash is always the committed previous row's. The head's `hash` is returned unchanged (the old one).
-- SECURITY DEFINER: the application role may only read audit_chain_heads; what the row carries is overwritten.
CREATE OR REPLACE FUNCTION audit_log_chain() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
  head_seq bigint;
  head_hash text;
BEGIN
  INSERT INTO audit_chain_heads AS h (chain, seq, hash) VALUES (coalesce(NEW.tenant_id, ''), 1, '')
    ON CONFLICT (chain) DO UPDATE SET seq = h.seq + 1
    RETURNING h.seq, h.hash INTO head_seq, head_hash;
  NEW.seq := head_seq;
  NEW.prev_hash := head_hash;
  NEW.hash := audit_row_hash(head_hash, NEW.id, head_seq, coalesce(NEW.tenant_id, ''), NEW.at, NEW.actor, NEW.action, NEW.target, NEW.request_id, NEW.detail);
  UPDATE audit_chain_heads SET hash = NEW.hash WHERE chain = coalesce(NEW.tenant_id, '');
  RETURN NEW;
END
$$;
--> statement-breakpoint
CREATE TRIGGER audit_log_chain BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION audit_log_chain();
--> statement-breakpoint
-- Append-only, even for the owner and superusers (only disabling the triggers, which the verifier then catches, gets past).
CREATE OR REPLACE FUNCTION audit_log_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;
--> statement-breakpoint
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log FOR EACH ROW EXECUTE FUNCTION audit_log_refuse();
--> statement-breakpoint
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log FOR EACH ROW EXECUTE FUNCTION audit_log_refuse();
--> statement-breakpoint
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log FOR EACH STATEMENT EXECUTE FUNCTION audit_log_refuse();
--> statement-breakpoint
-- A head removed would restart its chain at seq 1 (and every insert would then fail on audit_chain_idx).
CREATE TRIGGER audit_chain_heads_no_delete BEFORE DELETE ON audit_chain_heads FOR EACH ROW EXECUTE FUNCTION audit_log_refuse();
--> statement-breakpoint
CREATE TRIGGER audit_chain_heads_no_truncate BEFORE TRUNCATE ON audit_chain_heads FOR EACH STATEMENT EXECUTE FUNCTION audit_log_refuse();
--> statement-breakpoint
-- The application's role: every right on the application's tables but UPDATE/DELETE/TRUNCATE on audit_log and all but
-- SELECT on audit_chain_heads; later tables get the same by default privileges. Roles are per cluster (several databases of one
-- server may race to create it). Where the migrating user may not create roles, a notice says so and nothing fails:
-- the programs then refuse to start with DATABASE_APP_ROLE set (schema/db.ts) until an administrator creates it.
DO $$
DECLARE
  s text := current_schema();
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'agentvm_app') THEN
    BEGIN
      CREATE ROLE agentvm_app NOLOGIN;
    EXCEPTION
      WHEN duplicate_object OR unique_violation THEN NULL;
      WHEN insufficient_privilege THEN
        RAISE NOTICE 'agentvm_app not created (%): create it and rerun, or run the application without DATABASE_APP_ROLE', SQLERRM;
        RETURN;
    END;
  END IF;
  -- A migrating user that is no superuser must be a member to SET ROLE to it (PG 16+ no longer makes the creator one).
  IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AND NOT pg_has_role(current_user, 'agentvm_app', 'MEMBER') THEN
    BEGIN
      EXECUTE format('GRANT agentvm_app TO %I', current_user);
    EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
      RAISE NOTICE 'could not grant agentvm_app to % (%)', current_user, SQLERRM;
    END;
  END IF;
  EXECUTE format('GRANT USAGE ON SCHEMA %I TO agentvm_app', s);
  EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO agentvm_app', s);
  EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO agentvm_app', s);
  EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO agentvm_app', s);
  EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT USAGE, SELECT ON SEQUENCES TO agentvm_app', s);
  REVOKE UPDATE, DELETE, TRUNCATE ON audit_log FROM agentvm_app;
  REVOKE ALL ON audit_chain_heads FROM agentvm_app;
  GRANT SELECT ON audit_chain_heads TO agentvm_app; -- the verifier compares the head with the last row
END
$$;
