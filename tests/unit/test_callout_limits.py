"""The callout's memory: open connections per credential, and failed authentications per host
(the live checks are tests/integration/test_nats_revocation.py, against a real nats-server)."""

from __future__ import annotations

from adapters.nats.callout_limits import CalloutLimits, ConnectionTable, FailureLimiter, credential_of


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_connections_are_counted_per_credential_and_leave_when_gone() -> None:
    table = ConnectionTable(Clock())
    table.add("tok1", ("S1", 1))
    table.add("tok1", ("S1", 2))
    table.add("tok1", ("S1", 2))  # the callout's note and then the server's connect event
    table.add("ccr1", ("S2", 1))
    assert (table.count("tok1"), table.count("ccr1"), len(table)) == (2, 1, 3)
    table.remove(("S1", 1))
    table.remove(("S1", 9))  # never known: nothing happens
    assert table.connections("tok1") == [("S1", 2)]
    table.add("tok2", ("S1", 2))  # a client id reused (a restarted server): the new owner's
    assert (table.count("tok1"), table.count("tok2")) == (0, 1)
    assert sorted(table.credentials()) == ["ccr1", "tok2"]


def test_a_listing_replaces_what_it_predates_and_keeps_what_is_newer() -> None:
    clock = Clock()
    table = ConnectionTable(clock)
    table.add("tok1", ("S1", 1))  # closed while no event reached us
    table.add("tok1", ("OLD", 7))  # on a server that restarted (it has a new id now)
    since = clock.now = 101.0
    clock.now = 101.5
    table.add("tok1", ("S1", 3))  # authorized after the listing was asked for
    table.replace({("S1", 2): "tok1", ("S1", 4): "ccr1"}, since)
    assert table.connections("tok1") == [("S1", 2), ("S1", 3)]
    assert table.connections("ccr1") == [("S1", 4)]


def test_a_host_is_blocked_after_its_failures_until_they_age_out() -> None:
    clock = Clock()
    limiter = FailureLimiter(limit=3, window=10.0, clock=clock)
    for _ in range(2):
        limiter.failed("10.0.0.1")
    assert not limiter.blocked("10.0.0.1", "good")
    limiter.failed("10.0.0.1")
    assert limiter.blocked("10.0.0.1", "good")  # even with a secret never seen
    assert not limiter.blocked("10.0.0.2", "good")  # another host
    clock.now += 9.0
    assert limiter.blocked("10.0.0.1", "good")
    clock.now += 1.5
    assert not limiter.blocked("10.0.0.1", "good")


def test_a_known_secret_gets_in_while_its_host_is_blocked() -> None:
    limiter = FailureLimiter(limit=1, window=60.0, clock=Clock())
    limiter.succeeded("agent")
    limiter.failed("10.0.0.1")
    assert limiter.blocked("10.0.0.1", "guess")
    assert not limiter.blocked("10.0.0.1", "agent")


def test_no_limit_when_turned_off() -> None:
    limiter = FailureLimiter(limit=0, window=60.0, clock=Clock())
    for _ in range(100):
        limiter.failed("10.0.0.1")
    assert not limiter.blocked("10.0.0.1", "x")
    assert CalloutLimits(per_identity=0).cap("team") == 0
    assert CalloutLimits().cap("cluster") == 1024
    assert CalloutLimits().cap("admin") == 16


def test_only_callout_users_have_a_credential() -> None:
    assert credential_of("team:llm/tok_123") == "tok_123"
    assert credential_of("cluster:c1/ccr_9") == "ccr_9"
    assert credential_of("gpufleet") is None
    assert credential_of("team:llm/") is None
