"""Which network addresses a tenant-chosen location may reach (server-side request forgery guard).

An import URL or a tenant's S3 endpoint is a host the platform connects to on a tenant's behalf. Only
globally routable unicast addresses are allowed. The rule is written out here rather than taken from
Python's `ipaddress.is_global`, whose answer changes between Python versions and misses several forms
(on 3.11: `64:ff9b::a9fe:a9fe`, `::a9fe:a9fe`, `fec0::1`, `3fff::1` are all "global").

- IPv4: refused when in `IPV4_NOT_PUBLIC` (loopback, RFC 1918 private, link-local with the cloud metadata
  endpoint 169.254.169.254, shared 100.64/10, "this network", IETF protocol, documentation, benchmarking,
  6to4 relay anycast, multicast, reserved and broadcast) or not `is_global`.
- IPv6 carrying an IPv4 address is decided by that IPv4 address alone (`embedded_ipv4`): IPv4-mapped
  `::ffff:a.b.c.d`, IPv4-translated `::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d`, the NAT64 well-known
  prefix `64:ff9b::/96` (a NAT64 gateway turns `64:ff9b::a9fe:a9fe` into 169.254.169.254), 6to4
  `2002:AABB:CCDD::/48` (bits 16-48) and Teredo `2001:0::/32` (the client, the last 32 bits inverted).
- Other IPv6: only global unicast space `2000::/3` outside `IPV6_NOT_PUBLIC` (IETF protocol assignments,
  documentation `2001:db8::/32` and `3fff::/20`), and `is_global`. Everything outside `2000::/3` is refused,
  among it loopback, unspecified, the local-use NAT64 prefix `64:ff9b:1::/48` (its IPv4 sits where the
  operator's prefix length puts it, so the whole /48 is refused), discard `100::/64`, unique-local `fc00::/7`
  (the AWS metadata endpoint fd00:ec2::254), link-local `fe80::/10`, deprecated site-local `fec0::/10`,
  SRv6 `5f00::/16` and multicast.

A host is resolved once and every address it resolves to must pass; the caller connects to the checked
address, so a second DNS answer (rebinding) cannot send it elsewhere. Residual risk, stated: a NAT64 gateway
with an operator-chosen network-specific prefix (RFC 6052) makes ordinary global-looking IPv6 addresses reach
IPv4 ones; nothing in an address says so, so such a network needs an egress firewall.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
"""Resolves (host, port) to the address strings to connect to (socket.getaddrinfo by default)."""

IPV4_NOT_PUBLIC = tuple(
    ipaddress.IPv4Network(network)
    for network in (
        "0.0.0.0/8",  # "this network"
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # shared address space (carrier-grade NAT)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, the cloud metadata endpoint 169.254.169.254
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # deprecated 6to4 relay anycast
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and the broadcast address
    )
)
IPV6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
IPV6_NOT_PUBLIC = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "2001::/23",  # IETF protocol assignments (Teredo, 2001::/32, is decided by its IPv4 before this)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
    )
)
# IPv6 prefixes whose last 32 bits are an IPv4 address.
IPV6_WITH_IPV4_IN_LAST_32_BITS = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "::ffff:0:0/96",  # IPv4-mapped
        "::ffff:0:0:0/96",  # IPv4-translated (SIIT)
        "::/96",  # IPv4-compatible (deprecated; :: and ::1 carry 0.0.0.0 and 0.0.0.1, both refused)
        "64:ff9b::/96",  # NAT64 well-known prefix
    )
)


class AddressNotAllowedError(Exception):
    """The host cannot be resolved, or resolves to an address a tenant may not reach."""


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (and would reach through a translator), where it carries one."""
    if address.teredo is not None:
        return address.teredo[1]  # the client; the server only helped it find its mapping
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in IPV6_WITH_IPV4_IN_LAST_32_BITS):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def is_public_address(address: IpAddress) -> bool:
    """True for a globally routable unicast address (see the module docstring for what is refused)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = embedded_ipv4(address)
        if embedded is not None:
            return is_public_address(embedded)
        if address not in IPV6_GLOBAL_UNICAST or any(address in n for n in IPV6_NOT_PUBLIC):
            return False
    elif any(address in network for network in IPV4_NOT_PUBLIC):
        return False
    return address.is_global and not address.is_multicast


def system_resolve(host: str, port: int) -> list[str]:
    """The addresses the system resolver gives for `host` (a literal address resolves to itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def resolve_checked_address(
    host: str, port: int, *, is_private_allowed: bool, resolve: Resolver | None = None
) -> str:
    """The one address to connect to for `host`: every address it resolves to must be public, unless
    `is_private_allowed` (tests and local development). AddressNotAllowedError otherwise.

    `resolve` replaces the system resolver (tests); None uses `system_resolve`.
    """
    try:
        found = (resolve or system_resolve)(host, port)
        addresses = [ipaddress.ip_address(value.split("%", 1)[0]) for value in found]
    except (OSError, UnicodeError, ValueError) as exc:
        raise AddressNotAllowedError(f"cannot resolve {host!r}") from exc
    if not addresses:
        raise AddressNotAllowedError(f"{host!r} has no address")
    if not is_private_allowed and not all(is_public_address(a) for a in addresses):
        raise AddressNotAllowedError(f"{host!r} resolves to a non-public address")
    return str(addresses[0])
