-- When each team was on a paid subscription. Metered usage is billed only inside these
-- periods: tokens used on the free plan before an upgrade, or after a subscription ended,
-- are never sent to Stripe. At most one open period (ended_at NULL) per team.
CREATE TABLE billing_periods (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     bigint NOT NULL REFERENCES teams (id),
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    CHECK (ended_at IS NULL OR ended_at >= started_at)
);
CREATE UNIQUE INDEX billing_periods_open ON billing_periods (team_id) WHERE ended_at IS NULL;
CREATE INDEX billing_periods_team ON billing_periods (team_id, started_at);
