-- Ordering of Stripe events per team. Stripe delivers webhooks in no particular order and
-- redelivers old ones, so every event that moves a team's billing state records its
-- `created` here: an invoice event older than the newest invoice or subscription event
-- already applied for the team is stale (a late "payment failed" after the invoice was
-- paid must not start a grace period). Subscription events keep their own per-subscription
-- order in stripe_subscriptions.event_created.
ALTER TABLE stripe_customers ADD COLUMN event_created bigint NOT NULL DEFAULT 0;
