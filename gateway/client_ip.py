"""Who is the client: the peer address, or what a trusted proxy says in X-Forwarded-For.

``X-Forwarded-For`` is believed only from configured proxies, and then read from the right:
each trusted hop appends the address it saw, so the first untrusted address from the right
is the client. Believing the header from anyone would let a free-tier user pick a new
identity per request and walk past every per-IP limit.

For the same reason the free tier limits an IPv6 client by its /64 (:func:`free_tier_key`):
one subscriber line gets a whole /64, and each of its addresses would otherwise be a new
client with fresh limits.
"""

from __future__ import annotations

import ipaddress

from gateway.config import Network


def client_ip(peer: str | None, forwarded_for: str | None, trusted: tuple[Network, ...]) -> str:
    """The client's address given the TCP peer and the ``X-Forwarded-For`` header."""
    peer = peer or "0.0.0.0"
    if not forwarded_for or not _is_trusted(peer, trusted):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    candidate = peer
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return candidate  # garbage from the client side: stop at the last good hop
        candidate = hop
        if not _is_trusted(hop, trusted):
            return hop
    return candidate


#: The IPv6 prefix length one client is assumed to hold (a subscriber's usual delegation).
IPV6_CLIENT_PREFIX = 64


def free_tier_key(address: str) -> str:
    """What the free tier limits: an IPv4 address (also when IPv4-mapped in IPv6), or the
    /64 an IPv6 address is in."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)


def _is_trusted(address: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in trusted)
