"""Wire-level facts that the gateway and the workers both rely on.

``gateway`` and ``workers`` never import each other; what both must agree on (the OpenAI
error shape, the fields that carry a tenant's cache salt, the worker-registry table) lives
here, in one place, with no imports of our own.
"""
