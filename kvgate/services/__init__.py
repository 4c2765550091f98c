"""Local stand-ins for production infrastructure: embedded Postgres and a SeaweedFS S3 server."""
