"""The built-in torch engine: model, tokenizer, paged KV pool, radix cache, scheduler."""
