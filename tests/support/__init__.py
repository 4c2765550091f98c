"""Fixtures and helpers shared by several test folders (real processes, accounts, stubs)."""
