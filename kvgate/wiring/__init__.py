"""Settings -> each package's own config: the only place below the CLI that reads `Settings`.

One module per package it configures: `database` (the DSN, embedded or not), `accounts`
(the browser accounts and billing), `public` (the public site and the staff dashboard),
`tiering` (the tier ladder of a worker or of tierd), `engine` (the built-in engine of
`kvgate worker`) and `sglang` (what an SGLang worker's pages are keyed by).
"""
