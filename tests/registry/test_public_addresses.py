"""Addresses an import may reach: public unicast only, unless the private-network setting allows more.

Issue 33 item 3: an IPv4 address inside IPv6 (NAT64, IPv4-compatible/-translated/-mapped, 6to4, Teredo) is
decided by the IPv4 address, and deprecated site-local fec0::/10 is refused. Nothing here resolves a name
over the network or connects anywhere: names resolve through an injected stub, literals resolve to themselves.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.public_addresses import (
    IPV4_NOT_PUBLIC,
    AddressNotAllowedError,
    embedded_ipv4,
    is_public_address,
    resolve_checked_address,
)

IPv4 = ipaddress.IPv4Address
IPv6 = ipaddress.IPv6Address


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
        "255.255.255.255",
        "192.0.0.9",
        "198.18.0.1",
        "::1",
        "::",
        "fe80::1",
        "fd00:ec2::254",  # AWS IPv6 metadata endpoint
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "2002:7f00:1::1",  # 6to4 wrapping 127.0.0.1
        # issue 33 item 3: what the probe got through
        "64:ff9b::a9fe:a9fe",  # NAT64 well-known prefix + 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 + 127.0.0.1
        "64:ff9b:1::a9fe:a9fe",  # local-use NAT64 prefix (RFC 8215)
        "64:ff9b:1:a9fe:a9:fe00::",  # local-use NAT64 /48 with RFC 6052's /48 layout
        "64:ff9b:1::808:808",  # local-use NAT64 is refused whatever it carries
        "::a9fe:a9fe",  # IPv4-compatible 169.254.169.254
        "::10.0.0.1",  # IPv4-compatible private
        "::ffff:0:a9fe:a9fe",  # IPv4-translated 169.254.169.254
        "::ffff:0:192.168.0.1",
        "fec0::1",  # deprecated site-local
        "fec0:0:0:ffff::1",
        "feff::1",
        "2002:a9fe:a9fe::1",  # 6to4 wrapping 169.254.169.254
        "2002:0a00:0001:1::1",  # 6to4 wrapping 10.0.0.1
        "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo, client 169.254.169.254 (inverted bits)
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
        # forms Python 3.11's is_global calls global
        "3fff::1",  # documentation (RFC 9637)
        "5f00::1",  # SRv6 SIDs
        "64:ff9b:2::1",  # reserved, next to the NAT64 prefixes
        "100::1",  # discard
        "2001:db8::1",  # documentation
        "2001:20::1",  # ORCHIDv2
        "4000::1",  # outside global unicast space 2000::/3
        "ff02::1",  # multicast
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "52.216.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:81b::200e",
        "64:ff9b::808:808",  # NAT64 to 8.8.8.8: how an IPv6-only server reaches a public IPv4 host
        "2002:0808:0808::1",  # 6to4 wrapping 8.8.8.8
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, client 8.8.8.8
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address))


# ---- every IPv6 embedding of an IPv4 address -----------------------------------------------------------


def _last_32_bits(prefix: str) -> Callable[[IPv4, st.DataObject], IPv6]:
    def embed(ipv4: IPv4, data: st.DataObject) -> IPv6:
        return IPv6(int(IPv6(prefix)) | int(ipv4))

    return embed


def _sixtofour(ipv4: IPv4, data: st.DataObject) -> IPv6:
    subnet_and_host = data.draw(st.integers(0, 2**80 - 1), label="6to4 subnet and interface id")
    return IPv6((0x2002 << 112) | (int(ipv4) << 80) | subnet_and_host)


def _teredo(ipv4: IPv4, data: st.DataObject) -> IPv6:
    server = data.draw(st.sampled_from([IPv4("65.54.227.120"), IPv4("10.0.0.1"), IPv4("127.0.0.1")]))
    flags_and_port = data.draw(st.integers(0, 2**32 - 1), label="Teredo flags and obfuscated port")
    client = int(ipv4) ^ 0xFFFFFFFF
    return IPv6((0x20010000 << 96) | (int(server) << 64) | (flags_and_port << 32) | client)


EMBEDDINGS: dict[str, Callable[[IPv4, st.DataObject], IPv6]] = {
    "IPv4-mapped ::ffff:a.b.c.d": _last_32_bits("::ffff:0:0"),
    "IPv4-translated ::ffff:0:a.b.c.d": _last_32_bits("::ffff:0:0:0"),
    "IPv4-compatible ::a.b.c.d": _last_32_bits("::"),
    "NAT64 64:ff9b::/96": _last_32_bits("64:ff9b::"),
    "6to4 2002::/16": _sixtofour,
    "Teredo 2001::/32": _teredo,
}
LOCAL_USE_NAT64 = {  # refused whatever they carry
    "local-use NAT64 64:ff9b:1::/96": _last_32_bits("64:ff9b:1::"),
    "local-use NAT64 64:ff9b:1:ffff::/96": _last_32_bits("64:ff9b:1:ffff::"),
}

refused_ipv4 = st.one_of(
    st.sampled_from(IPV4_NOT_PUBLIC).flatmap(
        lambda net: st.integers(int(net.network_address), int(net.broadcast_address)).map(IPv4)
    ),
    st.ip_addresses(v=4).filter(lambda a: not is_public_address(a)),
)
public_ipv4 = st.ip_addresses(v=4).filter(is_public_address)


@given(ipv4=refused_ipv4, how=st.sampled_from(sorted(EMBEDDINGS | LOCAL_USE_NAT64)), data=st.data())
def test_a_refused_ipv4_address_is_refused_in_every_ipv6_embedding(ipv4: IPv4, how: str, data) -> None:
    address = (EMBEDDINGS | LOCAL_USE_NAT64)[how](ipv4, data)
    assert not is_public_address(address), f"{address} ({how} of {ipv4})"


@given(ipv4=public_ipv4, how=st.sampled_from(sorted(EMBEDDINGS)), data=st.data())
def test_a_public_ipv4_address_is_allowed_in_every_embedding_that_carries_it(ipv4: IPv4, how, data) -> None:
    address = EMBEDDINGS[how](ipv4, data)
    assert embedded_ipv4(address) == ipv4
    assert is_public_address(address), f"{address} ({how} of {ipv4})"


@given(ipv4=public_ipv4, how=st.sampled_from(sorted(LOCAL_USE_NAT64)), data=st.data())
def test_the_local_use_nat64_prefix_is_refused_whatever_it_carries(ipv4: IPv4, how: str, data) -> None:
    assert not is_public_address(LOCAL_USE_NAT64[how](ipv4, data))


# ---- resolution ----------------------------------------------------------------------------------------


def _stub_resolver(answers: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        return answers[host]

    return resolve


@pytest.mark.parametrize("answer", ["64:ff9b::a9fe:a9fe", "::ffff:0:a9fe:a9fe", "fec0::1", "::a9fe:a9fe"])
def test_a_name_resolving_to_an_embedded_private_address_is_refused(answer: str) -> None:
    resolve = _stub_resolver({"imports.example": ["2606:4700:4700::1111", answer]})
    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("imports.example", 443, is_private_allowed=False, resolve=resolve)


def test_the_checked_address_is_the_one_returned() -> None:
    resolve = _stub_resolver({"imports.example": ["64:ff9b::808:808", "8.8.4.4"]})
    assert resolve_checked_address("imports.example", 443, is_private_allowed=False, resolve=resolve) == (
        "64:ff9b::808:808"
    )


def test_a_literal_embedded_address_is_refused_without_a_resolver() -> None:
    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("64:ff9b::a9fe:a9fe", 443, is_private_allowed=False)


def test_a_host_resolving_to_loopback_is_refused_unless_private_networks_are_allowed() -> None:
    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("localhost", 443, is_private_allowed=False)
    assert ipaddress.ip_address(
        resolve_checked_address("localhost", 443, is_private_allowed=True)
    ).is_loopback


def test_an_unresolvable_host_is_refused() -> None:
    def unresolvable(host: str, port: int) -> list[str]:
        raise OSError("no such host")

    with pytest.raises(AddressNotAllowedError):
        resolve_checked_address("no-such-host.invalid", 443, is_private_allowed=True, resolve=unresolvable)
