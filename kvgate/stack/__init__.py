"""`kvgate up`: the single-machine stack, its supervisor, its parts and the local services.

`supervisor` runs an ordered list of parts and stops them newest first; `parts` lists what
`kvgate up` starts; `process` runs one child process as a part; `postgres` and `seaweed`
are local stand-ins for production infrastructure (embedded PostgreSQL, a SeaweedFS S3
server); `ports` finds free loopback ports for them.
"""
