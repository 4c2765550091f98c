"""``kvgate bench faults``: the stack under steady load while one fault at a time is injected.

``command`` is the click command, ``stack`` the processes it starts (with the handles a
fault needs: kill, freeze, restart), ``proxy`` the fault-injecting HTTP proxy in front of
the object store, ``load`` the clients and what they saw, ``matrix`` the faults,
``report`` the verdicts and the Markdown.
"""
