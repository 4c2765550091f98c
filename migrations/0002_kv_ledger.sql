-- The KV ledger: one row per stored KV page, saying which shared tiers hold it.
--
-- A page key is a chained SHA-256 seeded with its namespace digest, so the key alone
-- identifies (namespace, key); it is the primary key, and `namespace` is kept for
-- per-namespace quotas and as a guard in lookups. Host RAM (L2) is private to a worker and
-- is not recorded here; `tiers` is a bit set: 1 = NAS (L3), 2 = object store (L4).
-- Invariant kept by writers: the data is written before its bit is set, and a bit is
-- cleared before (or when) the data is found gone.
CREATE TABLE kv_ledger (
    key         bytea       PRIMARY KEY CHECK (octet_length(key) = 32),
    namespace   bytea       NOT NULL CHECK (octet_length(namespace) = 32),
    size        integer     NOT NULL CHECK (size >= 0),
    tiers       smallint    NOT NULL CHECK (tiers > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    last_access timestamptz NOT NULL DEFAULT now(),
    hits        bigint      NOT NULL DEFAULT 0
);

-- tierd walks each tier from its least recently used page
CREATE INDEX kv_ledger_nas_lru ON kv_ledger (last_access) WHERE tiers & 1 <> 0;
CREATE INDEX kv_ledger_object_lru ON kv_ledger (last_access) WHERE tiers & 2 <> 0;
-- per-namespace quotas evict a namespace's coldest pages first
CREATE INDEX kv_ledger_namespace_lru ON kv_ledger (namespace, last_access);
