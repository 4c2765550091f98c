-- People, their sessions and emails, and the money side of teams (Stripe). Builds on
-- 0001_accounts.sql: a team is still the unit that owns keys, usage and a plan.

-- What a plan costs, shown in the console; Stripe prices are mapped to plans in settings.
ALTER TABLE plans ADD COLUMN monthly_price_cents integer NOT NULL DEFAULT 0
    CHECK (monthly_price_cents >= 0);
UPDATE plans SET monthly_price_cents = 4900 WHERE name = 'team';

-- A person who signs in. Emails are compared case-insensitively (stored lower-cased).
CREATE TABLE users (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    email          text NOT NULL UNIQUE CHECK (email = lower(email)),
    password_hash  text NOT NULL,
    verified_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE memberships (
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    team_id     bigint NOT NULL REFERENCES teams (id),
    role        text NOT NULL CHECK (role IN ('owner', 'member')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, team_id)
);
CREATE INDEX memberships_team ON memberships (team_id);

-- Signed-in browsers. Only the SHA-256 of the cookie value is stored, so a database
-- leak does not hand out live sessions.
CREATE TABLE sessions (
    token_hash  bytea PRIMARY KEY,
    user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);

-- Single-use links sent by email: verify an address, reset a password, join a team.
-- Stored hashed for the same reason as sessions.
CREATE TABLE email_tokens (
    token_hash  bytea PRIMARY KEY,
    purpose     text NOT NULL CHECK (purpose IN ('verify', 'reset', 'invite')),
    email       text NOT NULL,
    user_id     bigint REFERENCES users (id) ON DELETE CASCADE,
    team_id     bigint REFERENCES teams (id),
    invited_by  bigint REFERENCES users (id) ON DELETE SET NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz
);
CREATE INDEX email_tokens_team ON email_tokens (team_id) WHERE purpose = 'invite';

-- Consecutive failed logins per email; a success clears the row. Enough to slow guessing
-- without a lockout that an attacker could use to keep the owner out.
CREATE TABLE login_attempts (
    email         text PRIMARY KEY,
    failures      integer NOT NULL DEFAULT 0,
    last_failure  timestamptz NOT NULL DEFAULT now()
);

-- "Last used" of a key in the console without scanning the team's whole usage.
CREATE INDEX usage_key_ts ON usage (key_id, ts) WHERE key_id IS NOT NULL;

-- One Stripe customer per team, with the subscription state last applied from webhooks.
-- state: none (never paid), active, grace (payment failed, paid limits kept until
-- grace_until), lapsed (grace ran out: free limits).
CREATE TABLE stripe_customers (
    team_id        bigint PRIMARY KEY REFERENCES teams (id),
    customer_id    text NOT NULL UNIQUE,
    state          text NOT NULL DEFAULT 'none'
                   CHECK (state IN ('none', 'active', 'grace', 'lapsed')),
    grace_until    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE stripe_subscriptions (
    subscription_id  text PRIMARY KEY,
    team_id          bigint NOT NULL REFERENCES teams (id),
    status           text NOT NULL,
    price_id         text NOT NULL DEFAULT '',
    plan             text REFERENCES plans (name),
    -- Stripe's `created` of the event last applied: older events arriving late are ignored.
    event_created    bigint NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stripe_subscriptions_team ON stripe_subscriptions (team_id);

-- Every webhook event applied, by Stripe's event id: the same event delivered again is
-- acknowledged and skipped. Inserted in the transaction that applies the event.
CREATE TABLE stripe_events (
    event_id     text PRIMARY KEY,
    type         text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

-- Usage sent to Stripe Billing Meters: one row per team, meter and UTC day. The
-- identifier is derived from those three, so a retried report carries the same one and
-- Stripe counts it once. sent_at is set once Stripe acknowledged the event.
CREATE TABLE meter_reports (
    identifier  text PRIMARY KEY,
    team_id     bigint NOT NULL REFERENCES teams (id),
    meter       text NOT NULL,
    day         date NOT NULL,
    value       bigint NOT NULL CHECK (value >= 0),
    sent_at     timestamptz,
    UNIQUE (team_id, meter, day)
);
