-- Sign-in throttling per (email, client address), and per-address limits on the forms that
-- cost an Argon2 hash (gateway/console/throttle.py, gateway/pages/address_limit.py).
--
-- The login throttle was per email only, and checked the wait before the password: one
-- wrong try per window from anywhere kept the owner's right password at 429. Keyed by the
-- client address too, a stranger's failures slow the stranger; the per-address limits cap
-- what any one address may try across all emails. Rows of the old scheme keep client ''.
ALTER TABLE login_attempts ADD COLUMN client text NOT NULL DEFAULT '';
ALTER TABLE login_attempts DROP CONSTRAINT login_attempts_pkey;
ALTER TABLE login_attempts ADD PRIMARY KEY (email, client);

-- Requests per (scope, client) in a fixed window: one row each, bumped in one statement.
CREATE UNLOGGED TABLE address_hits (
    scope        text NOT NULL,
    client       text NOT NULL,
    window_start timestamptz NOT NULL DEFAULT now(),
    hits         integer NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, client)
);
