"""The team console under /console, and the sign-in pages in front of it.

Sign-up, verification, login and password reset (`sign_in`, slowed by `throttle`), then a
team's keys, usage, members and billing; `routes` lists every route in one place.
"""
