"""Addresses an import may reach: public unicast only, unless the private-network setting allows more."""

from __future__ import annotations

import ipaddress

import pytest

from registry.public_addresses import AddressNotAllowedError, is_public_address, resolve_checked_address


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata endpoint
        "100.64.0.1",  # shared address space
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00:ec2::254",  # AWS IPv6 metadata endpoint
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "2002:7f00:1::1",  # 6to4 wrapping 127.0.0.1
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "52.216.0.1", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


def test_a_host_resolving_to_loopback_is_refused_unless_private_networks_are_allowed() -> None:
    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("localhost", 443, is_private_allowed=False)
    assert ipaddress.ip_address(
        resolve_checked_address("localhost", 443, is_private_allowed=True)
    ).is_loopback


def test_an_unresolvable_host_is_refused() -> None:
    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("no-such-host.invalid", 443, is_private_allowed=True)
