"""Our tiers as SGLang's HiCache storage backend: the one part of tiering that may use torch.

`backend` is the class SGLang's factory loads; `options` is what it is told; `store` opens
the tiered store from those options; `pages` copies pages between SGLang's host pool and
our bytes; `loop` bridges SGLang's synchronous calls to our asyncio code.
"""
