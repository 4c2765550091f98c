-- Accounts, limits, usage and the worker registry: everything the gateway shares across
-- replicas. Hot-path state (rate limits, in-flight leases) is UNLOGGED: it is rebuilt in
-- seconds after a crash and must not cost WAL on every request.

-- Plans: what a tier may do. `free` is the anonymous trial tier (per client IP).
CREATE TABLE plans (
    name              text PRIMARY KEY,
    requests_per_min  integer NOT NULL CHECK (requests_per_min > 0),
    tokens_per_min    integer NOT NULL CHECK (tokens_per_min > 0),
    tokens_per_day    bigint  NOT NULL CHECK (tokens_per_day > 0),
    max_concurrent    integer NOT NULL CHECK (max_concurrent > 0),
    max_max_tokens    integer NOT NULL CHECK (max_max_tokens > 0),
    max_context       integer NOT NULL CHECK (max_context > 0)
);

INSERT INTO plans VALUES
    ('free',  10,  20000,    200000,  2,   512,  4096),
    ('team', 600, 400000, 20000000, 32,  4096, 32768);

CREATE TABLE teams (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    plan        text NOT NULL REFERENCES plans (name),
    -- Folded into every KV page key of this team's requests: no cache crosses tenants.
    cache_salt  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- API keys are stored as SHA-256 of the secret (the secret has >= 256 bits of entropy,
-- so a slow hash buys nothing) plus a visible prefix for humans.
CREATE TABLE api_keys (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team_id     bigint NOT NULL REFERENCES teams (id),
    name        text NOT NULL DEFAULT '',
    prefix      text NOT NULL,
    key_hash    bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_team ON api_keys (team_id);

-- One row per request, written in batches; request_id makes retried batches idempotent.
CREATE TABLE usage (
    request_id        text PRIMARY KEY,
    ts                timestamptz NOT NULL,
    team_id           bigint REFERENCES teams (id),
    key_id            bigint REFERENCES api_keys (id),
    client_ip         inet,
    subject           text NOT NULL,
    model             text NOT NULL,
    worker            text NOT NULL DEFAULT '',
    prompt_tokens     integer NOT NULL DEFAULT 0,
    cached_tokens     integer NOT NULL DEFAULT 0,
    completion_tokens integer NOT NULL DEFAULT 0,
    reserved_tokens   integer NOT NULL DEFAULT 0,
    ttft_ms           real,
    latency_ms        real NOT NULL,
    status            smallint NOT NULL
);
CREATE INDEX usage_team_ts ON usage (team_id, ts);

-- Daily roll-up (UTC days), maintained by the same statement that inserts usage rows.
CREATE TABLE usage_daily (
    day               date NOT NULL,
    team_id           bigint REFERENCES teams (id),
    model             text NOT NULL,
    requests          bigint NOT NULL DEFAULT 0,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX usage_daily_key ON usage_daily (day, (coalesce(team_id, 0)), model);

-- GCRA state per subject ('team:<id>' or 'ip:<addr>'): theoretical arrival times.
CREATE UNLOGGED TABLE rate_state (
    subject  text PRIMARY KEY,
    req_tat  timestamptz NOT NULL DEFAULT now(),
    tok_tat  timestamptz NOT NULL DEFAULT now()
);

-- Tokens spent per subject and UTC day (the daily quota).
CREATE UNLOGGED TABLE rate_daily (
    subject  text NOT NULL,
    day      date NOT NULL,
    used     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (subject, day)
);

-- One lease per in-flight request; expiring so that a crashed replica frees its slots.
CREATE UNLOGGED TABLE inflight (
    lease_id    text PRIMARY KEY,
    subject     text NOT NULL,
    pool        text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX inflight_subject ON inflight (subject, expires_at);
CREATE INDEX inflight_pool ON inflight (pool, expires_at);

-- The admission decision: request GCRA, token GCRA, daily tokens, the subject's
-- concurrency cap and (for pooled tiers) a global in-flight cap, all under one row lock
-- on the subject, so any number of replicas decide exactly. One call = one statement.
-- Times are in milliseconds; `cost` is the token reservation for this request.
CREATE FUNCTION gateway_admit(
    p_subject text, p_rpm integer, p_tpm integer, p_tpd bigint, p_max_concurrent integer,
    p_cost integer, p_lease text, p_lease_ms integer, p_pool text, p_pool_max integer
) RETURNS TABLE (
    allowed boolean, reason text, retry_after_ms bigint,
    req_remaining integer, req_reset_ms bigint,
    tok_remaining integer, tok_reset_ms bigint,
    day_remaining bigint
) LANGUAGE plpgsql AS $$
DECLARE
    now_ts   timestamptz := clock_timestamp();
    win_ms   constant double precision := 60000;
    req_t    double precision := win_ms / p_rpm;
    tok_t    double precision := win_ms / p_tpm;
    st       rate_state%ROWTYPE;
    req_new  timestamptz;
    tok_new  timestamptz;
    v_used   bigint;
    v_busy   integer;
    pool_busy integer;
    req_ahead double precision;
    tok_ahead double precision;
BEGIN
    INSERT INTO rate_state (subject, req_tat, tok_tat) VALUES (p_subject, now_ts, now_ts)
        ON CONFLICT (subject) DO NOTHING;
    SELECT * INTO st FROM rate_state WHERE subject = p_subject FOR UPDATE;
    req_new := greatest(st.req_tat, now_ts) + make_interval(secs => req_t / 1000);
    tok_new := greatest(st.tok_tat, now_ts) + make_interval(secs => p_cost * tok_t / 1000);
    req_ahead := extract(epoch FROM req_new - now_ts) * 1000;
    tok_ahead := extract(epoch FROM tok_new - now_ts) * 1000;
    SELECT d.used INTO v_used FROM rate_daily d WHERE d.subject = p_subject AND d.day = (now_ts AT TIME ZONE 'UTC')::date;
    v_used := coalesce(v_used, 0);
    SELECT count(*) INTO v_busy FROM inflight i WHERE i.subject = p_subject AND i.expires_at > now_ts;

    reason := NULL;
    IF v_used + p_cost > p_tpd THEN
        reason := 'tokens_per_day';
        retry_after_ms := ceil(extract(epoch FROM (date_trunc('day', now_ts AT TIME ZONE 'UTC') + interval '1 day') - (now_ts AT TIME ZONE 'UTC')) * 1000);
    ELSIF req_ahead > win_ms + 1 THEN
        reason := 'requests_per_min';
        retry_after_ms := ceil(req_ahead - win_ms);
    ELSIF tok_ahead > win_ms + 1 THEN
        reason := 'tokens_per_min';
        retry_after_ms := ceil(tok_ahead - win_ms);
    ELSIF v_busy >= p_max_concurrent THEN
        reason := 'max_concurrent';
        retry_after_ms := 1000;
    ELSIF p_pool IS NOT NULL THEN
        -- The shared pool row serialises every member of the pool, not just this subject.
        INSERT INTO rate_state (subject) VALUES ('pool:' || p_pool) ON CONFLICT (subject) DO NOTHING;
        PERFORM 1 FROM rate_state WHERE subject = 'pool:' || p_pool FOR UPDATE;
        SELECT count(*) INTO pool_busy FROM inflight i WHERE i.pool = p_pool AND i.expires_at > now_ts;
        IF pool_busy >= p_pool_max THEN
            reason := 'pool_capacity';
            retry_after_ms := 1000;
        END IF;
    END IF;

    allowed := reason IS NULL;
    IF allowed THEN
        UPDATE rate_state SET req_tat = req_new, tok_tat = tok_new WHERE subject = p_subject;
        INSERT INTO rate_daily (subject, day, used) VALUES (p_subject, (now_ts AT TIME ZONE 'UTC')::date, p_cost)
            ON CONFLICT (subject, day) DO UPDATE SET used = rate_daily.used + p_cost;
        DELETE FROM inflight i WHERE i.subject = p_subject AND i.expires_at <= now_ts;
        INSERT INTO inflight VALUES (p_lease, p_subject, coalesce(p_pool, ''), now_ts + make_interval(secs => p_lease_ms / 1000.0));
        v_used := v_used + p_cost;
        retry_after_ms := 0;
    ELSE
        req_new := greatest(st.req_tat, now_ts);
        tok_new := greatest(st.tok_tat, now_ts);
    END IF;
    req_ahead := extract(epoch FROM req_new - now_ts) * 1000;
    tok_ahead := extract(epoch FROM tok_new - now_ts) * 1000;
    req_remaining := greatest(0, floor((win_ms - req_ahead) / req_t + 0.001))::integer;
    tok_remaining := greatest(0, floor((win_ms - tok_ahead) / tok_t + 0.001))::integer;
    req_reset_ms := ceil(req_ahead)::bigint;
    tok_reset_ms := ceil(tok_ahead)::bigint;
    day_remaining := greatest(0, p_tpd - v_used);
    RETURN NEXT;
END $$;

-- Worker registry: workers upsert themselves and heartbeat; silent ones age out.
CREATE TABLE workers (
    worker_id     text PRIMARY KEY,
    url           text NOT NULL,
    model         text NOT NULL,
    capacity      integer NOT NULL CHECK (capacity > 0),
    load          integer NOT NULL DEFAULT 0,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);
