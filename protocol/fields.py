"""Request fields and headers with a meaning shared by the gateway and the workers."""

#: Body fields that carry a tenant's cache salt. SGLang 0.5 reads ``extra_key``; the
#: built-in engine honours both. The gateway overwrites whatever the client sent.
CACHE_SALT_FIELDS: tuple[str, ...] = ("extra_key", "cache_salt")

#: Header a client may send to pin a conversation's turns together.
SESSION_HEADER = "x-session-id"

#: Header carrying the request id end to end.
REQUEST_ID_HEADER = "x-request-id"

#: Where a worker's tiers are attached and detached at runtime (SGLang's path for its
#: storage backend), and the name the built-in worker gives its own tiers there.
STORAGE_BACKEND_PATH = "/hicache/storage-backend"
TIERS_BACKEND = "kvgate"
