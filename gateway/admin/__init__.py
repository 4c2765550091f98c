"""The staff dashboard under /admin: leads, teams, workers and tiers, usage, audit log."""
