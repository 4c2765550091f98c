-- Metered usage is reported per closed interval instead of per UTC day (gateway/billing/meters.py).
--
-- A day's usage used to become one meter event stamped at 12:00 UTC and sent after midnight.
-- Stripe bills an event by its timestamp against the subscription's billing period and
-- finalizes that period's invoice about an hour after it ends, so usage after a renewal at
-- 14:37 was stamped into the old period and arrived after its invoice was final (never
-- billed), the last day before a cancellation arrived after the final invoice, and usage after
-- a 15:00 start was stamped before the subscription existed. Now each event covers one
-- interval [starts_at, ends_at): an hour, or the part of one on either side of a billing
-- period boundary; it is stamped with event_time inside that interval and sent minutes after
-- the interval closes.
--
-- A row is the event exactly as it is (re)sent: identifier, customer, timestamp and value are
-- fixed when the row is written, so a retry after a crash or a 5xx repeats the same request.
-- A team's next interval starts where its latest row ends, so no usage is reported twice.
--
-- Rows of the daily scheme become the whole-day intervals they were, stamped at noon as they
-- were sent, under their old identifiers: a day already sent is never sent again (and every
-- team resumes after its last reported day), and a day left unsent by a failure is sent by
-- the new reporter exactly as the old one would have, so Stripe still counts it once.
ALTER TABLE meter_reports
    ADD COLUMN customer_id text,
    ADD COLUMN starts_at   timestamptz,
    ADD COLUMN ends_at     timestamptz,
    ADD COLUMN event_time  timestamptz;

UPDATE meter_reports m SET
    customer_id = c.customer_id,
    starts_at = m.day::timestamp AT TIME ZONE 'UTC',
    ends_at = (m.day + 1)::timestamp AT TIME ZONE 'UTC',
    event_time = (m.day::timestamp + interval '12 hours') AT TIME ZONE 'UTC'
FROM stripe_customers c WHERE c.team_id = m.team_id;

-- The daily reporter only ever wrote rows for teams with a Stripe customer, and customers are
-- never deleted, so every row was filled above. Dropping `day` also drops UNIQUE (team, meter,
-- day), and makes a reporter of the old version still running fail instead of sending days
-- that the new one reports by the hour.
ALTER TABLE meter_reports
    ALTER COLUMN customer_id SET NOT NULL,
    ALTER COLUMN starts_at SET NOT NULL,
    ALTER COLUMN ends_at SET NOT NULL,
    ALTER COLUMN event_time SET NOT NULL,
    DROP COLUMN day,
    ADD CONSTRAINT meter_reports_interval CHECK (starts_at < ends_at),
    ADD CONSTRAINT meter_reports_team_meter_start UNIQUE (team_id, meter, starts_at);

-- Where each team's next interval starts (max(ends_at)), and what is still to send.
CREATE INDEX meter_reports_team_end ON meter_reports (team_id, ends_at);
CREATE INDEX meter_reports_unsent ON meter_reports (event_time) WHERE sent_at IS NULL;

-- The subscription's current billing period, from its webhooks. Its bounds are where Stripe
-- switches invoices, so the reporter splits intervals there: usage before a renewal is billed
-- on the invoice that the renewal closes, usage after it on the next one.
ALTER TABLE stripe_subscriptions
    ADD COLUMN current_period_start timestamptz,
    ADD COLUMN current_period_end   timestamptz;
