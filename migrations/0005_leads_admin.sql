-- The public site's sales leads and the staff dashboard: who is staff, leads with their
-- notes, an audit log of every admin action, team suspension, and samples of the workers'
-- tier metrics for charts over time. Builds on 0001 (teams, keys, usage) and 0003 (users).

ALTER TABLE users ADD COLUMN is_staff boolean NOT NULL DEFAULT false;

-- One row per contact-sales submission. The row is written before the sales team is
-- notified, so a failing mail server never loses a lead (notified_at stays NULL).
CREATE TABLE leads (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at      timestamptz NOT NULL DEFAULT now(),
    name            text NOT NULL,
    email           text NOT NULL CHECK (email = lower(email)),
    email_domain    text GENERATED ALWAYS AS (split_part(email, '@', 2)) STORED,
    company         text NOT NULL,
    team_size       text NOT NULL DEFAULT '',
    monthly_tokens  text NOT NULL DEFAULT '',
    use_case        text NOT NULL DEFAULT '',
    message         text NOT NULL DEFAULT '',
    client_ip       inet,
    status          text NOT NULL DEFAULT 'new'
                    CHECK (status IN ('new', 'contacted', 'qualified', 'won', 'lost', 'nurture')),
    lost_reason     text NOT NULL DEFAULT '',
    owner_id        bigint REFERENCES users (id) ON DELETE SET NULL,
    next_follow_up  date,
    contacted_at    timestamptz,
    notified_at     timestamptz,
    CHECK (status <> 'lost' OR lost_reason <> '')
);
CREATE INDEX leads_created ON leads (created_at);
CREATE INDEX leads_ip_created ON leads (client_ip, created_at);
CREATE INDEX leads_domain ON leads (email_domain);

CREATE TABLE lead_notes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lead_id     bigint NOT NULL REFERENCES leads (id) ON DELETE CASCADE,
    author_id   bigint REFERENCES users (id) ON DELETE SET NULL,
    body        text NOT NULL CHECK (body <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lead_notes_lead ON lead_notes (lead_id, created_at);

-- Every admin action: who (email kept even if the user is deleted), what, when, and the
-- state before and after.
CREATE TABLE admin_audit (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor_id     bigint REFERENCES users (id) ON DELETE SET NULL,
    actor_email  text NOT NULL,
    action       text NOT NULL,
    target       text NOT NULL,
    before       jsonb,
    after        jsonb
);
CREATE INDEX admin_audit_at ON admin_audit (at);

-- A suspended team's keys are revoked (that is what the gateway checks on every lookup);
-- the ids revoked by the suspension are kept so that unsuspending restores exactly those.
CREATE TABLE team_suspensions (
    team_id       bigint PRIMARY KEY REFERENCES teams (id),
    suspended_at  timestamptz NOT NULL DEFAULT now(),
    suspended_by  bigint REFERENCES users (id) ON DELETE SET NULL,
    reason        text NOT NULL DEFAULT '',
    key_ids       bigint[] NOT NULL DEFAULT '{}'
);

-- A key created while its team is suspended (from the console) is born revoked, and is
-- restored with the others on unsuspension.
CREATE FUNCTION api_keys_suspended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM team_suspensions WHERE team_id = NEW.team_id) THEN
        NEW.revoked_at := coalesce(NEW.revoked_at, now());
        UPDATE team_suspensions SET key_ids = key_ids || NEW.id WHERE team_id = NEW.team_id;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER api_keys_suspended BEFORE INSERT ON api_keys
    FOR EACH ROW EXECUTE FUNCTION api_keys_suspended();

-- Tier figures scraped from the workers' /metrics, at most one row per worker, tier and
-- minute: the workers-and-tiers page draws its charts over time from these.
CREATE TABLE tier_samples (
    minute      timestamptz NOT NULL,
    worker_id   text NOT NULL,
    tier        text NOT NULL,
    used_bytes  bigint NOT NULL,
    items       bigint NOT NULL,
    hits        bigint NOT NULL,
    misses      bigint NOT NULL,
    failures    bigint NOT NULL,
    PRIMARY KEY (minute, worker_id, tier)
);

-- A lead's trial-use signals look up the free tier's requests by client address.
CREATE INDEX usage_free_ip ON usage (client_ip, ts) WHERE team_id IS NULL;
