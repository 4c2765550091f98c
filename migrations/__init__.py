"""Ordered SQL migrations (``NNNN_name.sql`` beside this file) and the runner that applies them."""
