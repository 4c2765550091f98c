"""What every browser-facing area (console, public site, staff dashboard) shares.

The page kit (`kit.PageKit`: templates, guards, mail links), CSRF, browser sessions and
the people behind them (`users`, `passwords`), single-use email links, outgoing mail,
server-drawn charts, security headers, and the settings of all of it (`config`).
"""
