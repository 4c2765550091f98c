"""The public gateway: an OpenAI-compatible front door with keys, limits, routing and usage.

Starlette on uvicorn, no torch, no import of ``workers``: it talks to workers over HTTP and
learns about them from the worker registry in Postgres (``protocol.registry``).
"""
