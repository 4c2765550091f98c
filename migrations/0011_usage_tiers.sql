-- Cached prompt tokens by the tier they came back from (protocol/tiers.py: device, host,
-- nas, object), per request and in the daily roll-up (gateway/usage.py writes both), so the
-- console can show per day what each tier served and what that saved
-- (gateway/console/usage_report.py).
--
-- The workers report the split with every answer (usage.prompt_tokens_details
-- .cached_tokens_by_tier); until now only its sum, cached_tokens, was kept. Rows written
-- before this migration keep zeros here: their cached tokens are known, their tiers are not,
-- and the console shows that part as not recorded. A constant default adds the columns
-- without rewriting the tables.
ALTER TABLE usage
    ADD COLUMN cached_device_tokens integer NOT NULL DEFAULT 0,
    ADD COLUMN cached_host_tokens   integer NOT NULL DEFAULT 0,
    ADD COLUMN cached_nas_tokens    integer NOT NULL DEFAULT 0,
    ADD COLUMN cached_object_tokens integer NOT NULL DEFAULT 0;

ALTER TABLE usage_daily
    ADD COLUMN cached_device_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cached_host_tokens   bigint NOT NULL DEFAULT 0,
    ADD COLUMN cached_nas_tokens    bigint NOT NULL DEFAULT 0,
    ADD COLUMN cached_object_tokens bigint NOT NULL DEFAULT 0;
