"""The bound on failed authentications per source, and the edge's Host and proxy helpers, without a server."""

from __future__ import annotations

import pytest

from controlplane.api.edge import host_allowed, host_name
from controlplane.service.auth_limits import FailedAuthLimiter, TooManyFailures, source_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_blocks_then_drains_at_limit_per_window() -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(limit=10, window=60.0, clock=clock)  # drains one per 6 s
    for _ in range(10):
        limiter.check("192.0.2.1")
        limiter.failed("192.0.2.1")
    with pytest.raises(TooManyFailures) as refused:
        limiter.check("192.0.2.1")
    assert refused.value.retry_after == 6
    limiter.check("192.0.2.2")  # another address is not affected
    clock.now += 5.9
    with pytest.raises(TooManyFailures):
        limiter.check("192.0.2.1")
    clock.now += 0.2
    limiter.check("192.0.2.1")  # one more attempt fits
    limiter.failed("192.0.2.1")
    with pytest.raises(TooManyFailures):
        limiter.check("192.0.2.1")
    # sustained: an address that keeps failing gets limit attempts per window, not more
    attempts = 0
    for _ in range(600):  # one minute in steps of 0.1 s
        clock.now += 0.1
        try:
            limiter.check("192.0.2.1")
        except TooManyFailures:
            continue
        attempts += 1
        limiter.failed("192.0.2.1")
    assert 9 <= attempts <= 11
    clock.now += 60.0
    limiter.check("192.0.2.1")  # drained


def test_an_ipv6_host_counts_by_its_64_and_mapped_ipv4_as_ipv4() -> None:
    assert source_key("2001:db8:1:2::1") == source_key("2001:db8:1:2:ffff::7") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key("::ffff:192.0.2.5") == "192.0.2.5"
    assert source_key("testclient") == "testclient"
    limiter = FailedAuthLimiter(limit=2, window=60.0, clock=Clock())
    limiter.failed("2001:db8::1")
    limiter.failed("2001:db8::2")
    with pytest.raises(TooManyFailures):
        limiter.check("2001:db8::3")


def test_memory_is_bounded_by_max_sources() -> None:
    clock = Clock()
    limiter = FailedAuthLimiter(limit=3, window=60.0, max_sources=100, clock=clock)
    for i in range(1000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter._buckets) <= 100
    limiter.failed("10.9.9.9")
    limiter.failed("10.9.9.9")
    limiter.failed("10.9.9.9")
    with pytest.raises(TooManyFailures):  # the newest failing source is the last one forgotten
        limiter.check("10.9.9.9")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8080", "127.0.0.1"),
        ("LocalHost:8080", "localhost"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("example.com", "example.com"),
        ("", ""),
    ],
)
def test_host_name_drops_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


def test_host_patterns() -> None:
    trusted = ["api.example.com", "*.internal.example"]
    assert host_allowed("api.example.com", trusted)
    assert host_allowed("a.b.internal.example", trusted)
    assert not host_allowed("internal.example", trusted)
    assert not host_allowed("evilinternal.example", trusted)
    assert not host_allowed("api.example.com.evil", trusted)
    assert host_allowed("anything", ["*"])
    assert not host_allowed("", trusted)
