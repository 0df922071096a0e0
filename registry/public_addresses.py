"""Which network addresses a tenant-chosen location may reach (server-side request forgery guard).

An import URL or a tenant's S3 endpoint is a host the platform connects to on a tenant's behalf. Only
globally routable unicast addresses are allowed: never loopback, private (RFC 1918, unique-local), link-local
(the cloud metadata endpoint 169.254.169.254 and fd00:ec2::254 among them), shared (100.64/10), reserved,
multicast or unspecified addresses, nor an IPv4 address wrapped in IPv6 (::ffff:127.0.0.1). A host is
resolved once and every address it resolves to must pass; the caller connects to the checked address, so a
second DNS answer (rebinding) cannot send it elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressNotAllowedError(Exception):
    """The host cannot be resolved, or resolves to an address a tenant may not reach."""


def is_public_address(address: IpAddress) -> bool:
    """True for a globally routable unicast address (see the module docstring for what is refused)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if embedded is not None:
            return is_public_address(embedded)
    return address.is_global and not address.is_multicast


def resolve_checked_address(host: str, port: int, *, is_private_allowed: bool) -> str:
    """The one address to connect to for `host`: every address it resolves to must be public, unless
    `is_private_allowed` (tests and local development). AddressNotAllowedError otherwise."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise AddressNotAllowedError(f"cannot resolve {host!r}") from exc
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses:
        raise AddressNotAllowedError(f"{host!r} has no address")
    if not is_private_allowed and not all(is_public_address(a) for a in addresses):
        raise AddressNotAllowedError(f"{host!r} resolves to a non-public address")
    return str(addresses[0])
