"""The public site: landing, pricing, API docs, the free playground and contact sales."""
