"""Stripe billing: checkout and portal sessions, webhooks, metered usage and reconcile."""
