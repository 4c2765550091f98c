"""The KV tier ladder as a library: keys, block codec, tiers, ledger, cost model, store, tierd.

The core handles bytes and buffers only and never imports torch; torch lives in adapter
modules on the engine side. Nothing here reads ``kvgate.settings``: callers pass the small
config dataclasses defined next to each component.
"""
