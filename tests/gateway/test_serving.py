"""The engine's connection without a socket (gateway/serving.py): a `Serving` driven with events (the client's
bytes, timers, the end of a wait, the relay's answer, a registry that withdraws, backpressure), and the commands it
gives its client's side, its relay and its pool, in order. The listener is a stand-in that answers the decisions a
test lists (admission itself is test_admission.py's); the state is a real GatewayState, whose registry, open
streams and accounting the connection uses as it does when serving."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest

from contract import reasons
from contract.errors import Refusal
from gateway.admission import Admitted, NeedsExchange
from gateway.authority import Authority
from gateway.catchup import AwaitRegistry
from gateway.heads import CHUNKED, LENGTH, UNTIL_CLOSE, ResponseHead
from gateway.grantlag import GRANTS_RETRY, FreshGrants
from gateway.listeners import Listener
from gateway.metrics import Metrics
from gateway.registry import cert_fingerprints
from gateway.serving import Serving
from gateway.state import GatewayState
from gateway.status import upstream_refusal
from gateway.upload import QUEUE_HIGH
from gateway.upstream import CERTIFICATE_REFUSED, UpstreamError
from tests.gateway.support import DexState, Upstream, access_lines, gateway_config, registry_for

HEAD_TIMEOUT, IDLE = 10.0, 330.0
GET = b"GET /api/v1/namespaces/shop/pods HTTP/1.1\r\nHost: x\r\n\r\n"
UPSTREAM_HEAD = b"GET /api/v1/namespaces/shop/pods HTTP/1.1\r\nHost: api\r\n\r\n"


class Log(list):
    """The commands, in the order they were given."""


class Io:
    """The client's side: records each command; `clock` is the loop's time."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.clock = 1000.0
        self.waits: list[tuple] = []

    def now(self) -> float:
        return self.clock

    def write(self, data: bytes) -> None:
        self.log.append(("write", data))

    def close(self) -> None:
        self.log.append(("close",))

    def abort(self) -> None:
        self.log.append(("abort",))

    def reading(self, on: bool) -> None:
        self.log.append(("reading", on))

    def idle_at(self, when: float | None) -> None:
        self.log.append(("idle_at", when))

    def head_deadline(self, delay: float | None) -> None:
        self.log.append(("head_deadline", delay))

    def wait(self, start, then) -> None:
        self.waits.append((start, then))
        self.log.append(("wait", then.__name__))

    def cancel(self) -> None:
        self.log.append(("cancel",))


class Relay:
    """An upstream connection: records what it is told."""

    def __init__(self, pool: "Pool", name: str) -> None:
        self.pool, self.name, self.log = pool, name, pool.log

    def start(self, owner, head: bytes, head_only: bool, body: bool = False) -> None:
        self.log.append(("start", self.name, head, head_only, body))

    def send(self, data: bytes) -> None:
        self.log.append(("send", self.name, data))

    def end_body(self) -> None:
        self.log.append(("end_body", self.name))

    def pause_reading(self) -> None:
        self.log.append(("relay_reading", self.name, False))

    def resume_reading(self) -> None:
        self.log.append(("relay_reading", self.name, True))

    def detach(self) -> None:
        self.log.append(("detach", self.name))


class Pool:
    """The listener's relay pool: `idle` connections are taken, new ones come through a `connect` wait."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.idle: list[Relay] = []

    def take(self) -> Relay | None:
        return self.idle.pop() if self.idle else None

    async def connect(self) -> Relay:  # the wait's start: never called here, the test answers the wait
        raise AssertionError("a test answers the connect wait itself")

    def park(self, relay: Relay) -> None:
        self.log.append(("park", relay.name))


class Stub(Listener):
    """A listener whose admission answers `decisions` in turn (a Refusal is raised)."""

    def __init__(self, pool: Pool, authority: Authority) -> None:
        super().__init__("entrance", peer_calls=False, settles_grants=True)
        self.decisions: list = []
        self._pool, self.granted = pool, authority
        self.no_pool: Refusal | None = None  # what `pool` raises when set: no upstream can take the request

    def admit(self, state, client, fingerprint, request, *, until=None):
        decision = self.decisions.pop(0)
        client.peer, client.capabilities, client.close = "peer", "read-pods", False
        if isinstance(decision, Refusal):
            raise decision
        return decision

    def pool(self, state, decision):
        if self.no_pool is not None:
            raise self.no_pool
        return self._pool

    def authority(self, client, decision):
        return self.granted

    def namespace(self, target, watch):
        return None

    def upstream_refusal(self, err, client):
        return upstream_refusal(err)


@dataclasses.dataclass
class Rig:
    serving: Serving
    io: Io
    listener: Stub
    pool: Pool
    log: Log
    state: GatewayState

    def relay(self, name: str) -> Relay:
        return Relay(self.pool, name)

    def commands(self) -> list:
        out = list(self.log)
        self.log.clear()
        return out

    def answer_wait(self, result) -> None:
        _, then = self.io.waits.pop(0)
        then(result)

    def fail_wait(self, exc: Exception) -> None:
        self.io.waits.pop(0)
        self.serving.failed(exc)


@pytest.fixture
async def rig(pki, issuer_key, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    config = dataclasses.replace(gateway_config(pki, Upstream(port=1), DexState(port=1)), access_log=True)
    state = GatewayState.open(config, Metrics(), registry_for(pki, issuer_key))
    log = Log()
    io, pool = Io(log), Pool(log)
    listener = Stub(pool, Authority("peer", frozenset({"read-pods"}), ("mod", "controller"), time.time() + 600))
    serving = Serving(state, None, listener, None, io)  # type: ignore[arg-type]
    serving.opened()
    assert log == [("idle_at", 1000.0 + IDLE)]
    log.clear()
    yield Rig(serving, io, listener, pool, log, state)
    await state.close()


def answer(rig: Rig, relay: Relay, body: bytes = b"ok", framing: str = LENGTH) -> None:
    """The upstream answers the exchange on `relay`."""
    rig.serving.response_started(ResponseHead(200, b"200 OK", [], framing, len(body), True, None))
    rig.serving.response_bytes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + body)
    rig.serving.response_done()


def outcomes(caplog) -> list[tuple[int, str]]:
    return [(line["code"], line["outcome"]) for line in access_lines(caplog.records)]


# ----- deadlines ------------------------------------------------------------------------------------------
async def test_a_head_begun_has_its_deadline_and_one_not_complete_in_time_is_answered_408(rig, caplog):
    rig.serving.received(GET[:20])
    assert rig.commands() == [("head_deadline", HEAD_TIMEOUT)]
    rig.serving.received(GET[20:30])  # more of the same head: the deadline runs from its first byte
    assert rig.commands() == []
    rig.serving.head_due()
    (write, close) = rig.commands()
    assert write[0] == "write" and write[1].startswith(b"HTTP/1.1 408 ") and b"Connection: close" in write[1]
    assert reasons.REQUEST_TIMEOUT.encode() in write[1] and close == ("close",)


async def test_a_head_complete_in_time_disarms_its_deadline_and_a_late_timer_changes_nothing(rig):
    pooled = rig.relay("pooled")
    rig.pool.idle.append(pooled)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    rig.serving.received(GET[:20])
    rig.serving.received(GET[20:])
    assert rig.commands() == [("head_deadline", HEAD_TIMEOUT), ("head_deadline", None),
                              ("start", "pooled", UPSTREAM_HEAD, False, False)]
    rig.serving.head_due()  # a timer that fired as it was disarmed: the request is being served
    assert rig.commands() == []


async def test_an_idle_connection_is_closed_once_idle_timeout_passed_and_a_busy_one_is_not(rig):
    rig.io.clock += IDLE / 2
    rig.serving.idle_due()  # early (the timer is coarse): armed again for when it is due
    assert rig.commands() == [("idle_at", 1000.0 + IDLE)]
    watch = rig.relay("watch")
    rig.pool.idle.append(watch)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=True))
    rig.serving.received(GET)
    rig.commands()
    rig.io.clock = 1000.0 + IDLE * 3
    rig.serving.idle_due()  # a watch in progress is not idle
    assert rig.commands() == [("idle_at", rig.io.clock + 1)]
    answer(rig, watch)  # its end: idle from now
    rig.commands()
    rig.io.clock += IDLE - 1
    rig.serving.idle_due()
    assert rig.commands() == [("idle_at", rig.io.clock + 1)]
    rig.io.clock += 1
    rig.serving.idle_due()
    assert rig.commands() == [("close",)]


# ----- pipelining and backpressure -----------------------------------------------------------------------
async def test_pipelined_requests_are_served_one_after_another_in_order(rig, caplog):
    first, second = rig.relay("first"), rig.relay("second")
    rig.pool.idle += [second, first]
    rig.listener.decisions += [Admitted(b"one", watch=False), Admitted(b"two", watch=False)]
    rig.serving.received(GET + GET)
    assert rig.commands() == [("start", "first", b"one", False, False)]  # the second waits for the first's answer
    answer(rig, first, b"a1")
    assert rig.commands() == [("write", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\na1"),
                              ("start", "second", b"two", False, False)]
    answer(rig, second, b"a2")
    assert rig.commands() == [("write", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\na2")]
    assert outcomes(caplog) == [(200, "answered"), (200, "answered")]


async def test_a_client_sending_far_ahead_of_its_answers_is_not_read_until_they_come(rig):
    relay = rig.relay("r")
    rig.pool.idle.append(relay)
    rig.listener.decisions += [Admitted(b"one", watch=False)]
    rig.serving.received(GET)
    rig.commands()
    rig.serving.received(b"GET /x HTTP/1.1\r\nX-Pad: " + b"p" * rig.state.limits.max_header_bytes)
    assert rig.commands() == [("reading", False)]
    answer(rig, relay)
    # the head it sent ahead is over the limit: refused, and the connection ends
    (write, *rest) = rig.commands()
    assert write[1].startswith(b"HTTP/1.1 200 OK")
    assert rest[0][0] == "write" and rest[0][1].startswith(b"HTTP/1.1 431 ") and rest[1] == ("close",)


async def test_a_client_that_reads_slowly_slows_the_upstream_down_too(rig):
    relay = rig.relay("r")
    rig.pool.idle.append(relay)
    rig.listener.decisions.append(Admitted(b"watch", watch=True))
    rig.serving.writable(False)  # before the exchange: its relay starts paused
    rig.serving.received(GET)
    assert rig.commands() == [("start", "r", b"watch", False, False), ("relay_reading", "r", False)]
    rig.serving.writable(True)
    rig.serving.writable(False)
    assert rig.commands() == [("relay_reading", "r", True), ("relay_reading", "r", False)]
    answer(rig, relay)
    assert rig.commands()[-1] == ("relay_reading", "r", True)  # given back to its pool readable


async def test_a_body_is_held_while_it_waits_for_admission_then_sent_whole(rig):
    rig.listener.decisions.append(NeedsExchange("peering-peer", False, b"h", "t", 0.0, b"PUT", b"/x", b"x", [],
                                                None, True))
    chunk = b"%x\r\n%s\r\n" % (QUEUE_HIGH + 1, b"b" * (QUEUE_HIGH + 1))
    rig.serving.received(b"PUT /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk)
    assert rig.commands() == [("reading", False), ("wait", "_completed")]  # read with its head, then held
    relay = rig.relay("fresh")
    rig.answer_wait(Admitted(b"PUT head", watch=False))
    assert rig.commands() == [("wait", "_connected")]
    rig.answer_wait(relay)
    assert rig.commands() == [("start", "fresh", b"PUT head", False, True), ("send", "fresh", chunk),
                              ("reading", True)]
    rig.serving.received(b"0\r\n\r\n")
    assert rig.commands() == [("send", "fresh", b"0\r\n\r\n"), ("end_body", "fresh")]
    rig.serving.upstream_writable(False)
    rig.serving.upstream_writable(True)
    assert rig.commands() == [("reading", False), ("reading", True)]


# ----- waits ----------------------------------------------------------------------------------------------
async def test_a_request_behind_the_registry_waits_for_it_and_is_admitted_again_on_it(rig):
    behind = Refusal(404, reasons.PEER_NOT_FOUND, "not yet")
    rig.listener.decisions.append(AwaitRegistry(behind, 1, time.monotonic() + 2))
    rig.serving.received(GET)
    assert rig.commands() == [("wait", "_caught_up")]
    rig.pool.idle.append(rig.relay("r"))
    rig.answer_wait(Admitted(UPSTREAM_HEAD, watch=False))
    assert rig.commands() == [("start", "r", UPSTREAM_HEAD, False, False)]


async def test_a_wait_that_fails_is_answered_with_its_refusal_and_a_fault_with_500(rig, caplog):
    rig.listener.decisions += [AwaitRegistry(Refusal(404, reasons.PEER_NOT_FOUND, "x"), 1, 0.0),
                               AwaitRegistry(Refusal(404, reasons.PEER_NOT_FOUND, "x"), 1, 0.0)]
    rig.serving.received(GET)
    rig.fail_wait(Refusal(404, reasons.PEER_NOT_FOUND, "no such peer"))
    (_, write), = [c for c in rig.commands() if c[0] == "write"]
    assert write.startswith(b"HTTP/1.1 404 ") and b"no such peer" in write
    rig.serving.received(GET)
    rig.fail_wait(KeyError("a bug"))
    (write, close) = [c for c in rig.commands() if c[0] != "wait"]
    assert write[1].startswith(b"HTTP/1.1 500 ") and b"Connection: close" in write[1] and close == ("close",)
    assert outcomes(caplog) == [(404, "refused"), (500, "error")]
    (fault,) = [r for r in caplog.records if r.name == "gateway"]
    assert fault.levelno == logging.ERROR and "a bug" not in fault.getMessage()  # the traceback carries the rest


async def test_a_client_gone_while_its_request_waits_cancels_the_wait(rig, caplog):
    rig.listener.decisions.append(AwaitRegistry(Refusal(404, reasons.PEER_NOT_FOUND, "x"), 1, 0.0))
    rig.serving.received(GET)
    rig.commands()
    rig.serving.lost()
    assert rig.commands() == [("idle_at", None), ("cancel",)]
    assert outcomes(caplog) == [(499, "client_closed")]


# ----- retry ----------------------------------------------------------------------------------------------
async def test_a_pooled_connection_closed_under_the_request_is_retried_once_on_a_new_one(rig, caplog):
    stale, fresh = rig.relay("stale"), rig.relay("fresh")
    rig.pool.idle.append(stale)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    rig.serving.received(GET)
    rig.serving.upstream_failed(UpstreamError("request", "closed"), got=False)
    assert rig.commands() == [("start", "stale", UPSTREAM_HEAD, False, False), ("wait", "_connected")]
    rig.answer_wait(fresh)
    assert rig.commands() == [("start", "fresh", UPSTREAM_HEAD, False, False)]
    rig.serving.upstream_failed(UpstreamError("request", "closed again"), got=False)  # not a third time
    (write,) = rig.commands()
    assert write[1].startswith(b"HTTP/1.1 502 ") and b"closed again" in write[1]
    assert outcomes(caplog) == [(502, "refused")]


@pytest.mark.parametrize("why", ["certificate refused", "body sent on a fresh connection"])
async def test_what_would_fail_again_is_not_retried(rig, why):
    rig.listener.decisions.append(Admitted(b"PUT head", watch=False))
    if why == "certificate refused":
        rig.pool.idle.append(rig.relay("r"))
        rig.serving.received(GET)
        err = UpstreamError(CERTIFICATE_REFUSED, "CERTIFICATE_EXPIRED")
    else:
        rig.serving.received(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
        rig.answer_wait(rig.relay("fresh"))
        err = UpstreamError("request", "closed")
    rig.commands()
    rig.serving.upstream_failed(err, got=False)
    (write,) = rig.commands()
    assert write[0] == "write" and write[1][9:12] in (b"502", b"503")


async def test_an_answer_cut_by_its_upstream_cuts_the_client_too(rig, caplog):
    relay = rig.relay("r")
    rig.pool.idle.append(relay)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=True))
    rig.serving.received(GET)
    rig.serving.response_started(ResponseHead(200, b"200 OK", [], CHUNKED, None, True, None))
    rig.serving.response_bytes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    rig.serving.upstream_failed(UpstreamError("request", "reset"), got=True)
    assert rig.commands()[-1] == ("abort",)
    assert outcomes(caplog) == [(200, "interrupted")]


async def test_an_answer_until_close_closes_the_client_after_it(rig):
    relay = rig.relay("r")
    rig.pool.idle.append(relay)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    rig.serving.received(GET)
    answer(rig, relay, framing=UNTIL_CLOSE)
    assert rig.commands()[-1] == ("close",)


# ----- withdrawal -----------------------------------------------------------------------------------------
async def test_a_registry_that_withdraws_the_peering_cuts_its_stream(rig, pki, issuer_key, caplog):
    relay = rig.relay("watch")
    rig.pool.idle.append(relay)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=True))
    rig.serving.received(GET)
    rig.serving.response_started(ResponseHead(200, b"200 OK", [], CHUNKED, None, True, None))
    rig.commands()
    rig.state.publish(registry_for(pki, issuer_key, generation=2, effective=()))
    assert rig.commands() == [("abort",)]
    rig.serving.lost()  # the transport's end, after the abort
    assert rig.commands() == [("idle_at", None), ("detach", "watch")]
    assert outcomes(caplog) == [(200, "withdrawn")]


async def test_a_request_whose_authority_went_while_it_waited_is_refused_not_relayed(rig, pki, issuer_key):
    rig.listener.decisions.append(NeedsExchange("peering-peer", False, b"h", "t", 0.0, b"GET", b"/x", b"x", [],
                                                None, False))
    rig.serving.received(GET)
    rig.state.publish(registry_for(pki, issuer_key, generation=2, effective=()))
    rig.pool.idle.append(rig.relay("r"))
    rig.answer_wait(Admitted(UPSTREAM_HEAD, watch=False))
    commands = rig.commands()
    assert ("park", "r") in commands and not any(c[0] == "start" for c in commands)
    (write,) = [c for c in commands if c[0] == "write"]
    assert write[1].startswith(b"HTTP/1.1 403 ") and reasons.NO_EFFECTIVE_CAPABILITY.encode() in write[1]


async def test_a_request_admitted_at_once_that_no_upstream_can_take_is_answered_with_the_pools_refusal(rig, caplog):
    # The listener's contract: `pool` raises a Refusal when no upstream can take the request. The request admitted
    # at once (the keep-alive case) meets it as one admitted after a wait does: answered, never raised.
    rig.listener.no_pool = Refusal(404, reasons.PEER_NOT_FOUND, "the peer is gone")
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    rig.serving.received(GET)
    (write,) = rig.commands()
    assert write[0] == "write" and write[1].startswith(b"HTTP/1.1 404 ") and b"the peer is gone" in write[1]
    assert outcomes(caplog) == [(404, "refused")]


# ----- the peer protocol --------------------------------------------------------------------------------------
async def test_a_peer_call_waits_for_its_whole_body_then_for_the_control_loops_answer(rig, pki):
    (fp,) = cert_fingerprints(pki["peer"].cert_chain_pems[0].bytes())
    serving = Serving(rig.state, None, Stub(rig.pool, rig.listener.granted), fp, rig.io)  # type: ignore
    serving.listener.peer_calls = True
    serving.opened()
    rig.commands()
    serving.received(b"POST /peering/v1/notify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{")
    assert rig.commands() == []  # its body is not complete yet
    serving.received(b"}")
    assert rig.commands() == [("wait", "_call_answered")]
    rig.answer_wait(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
    assert rig.commands() == [("write", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")]
    serving.received(b"POST /peering/v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    (write,) = rig.commands()
    assert write[1].startswith(b"HTTP/1.1 404 ") and reasons.UNKNOWN_OPERATION.encode() in write[1]


# ----- the API server's authorizer behind a new grant -------------------------------------------------------
def forbidden(rig: Rig) -> None:
    rig.serving.response_started(ResponseHead(403, b"403 Forbidden", [], LENGTH, 10, True, None))


def granted_at(rig: Rig, when: float) -> None:
    """The state's registry, with its grants first seen at `when` (the rig's clock)."""
    rig.state.fresh_grants = FreshGrants()
    rig.state.fresh_grants.update(rig.state.registry, when)


async def test_a_403_to_a_grant_just_made_is_tried_again_until_the_grant_is_in_force(rig, caplog):
    granted_at(rig, rig.io.clock)
    first, second, third = rig.relay("first"), rig.relay("second"), rig.relay("third")
    rig.pool.idle.append(first)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    rig.serving.received(GET)
    forbidden(rig)  # the authorizer does not know the RoleBinding yet
    assert rig.commands() == [("start", "first", UPSTREAM_HEAD, False, False), ("detach", "first"),
                              ("wait", "_paused")]
    rig.io.clock += GRANTS_RETRY
    rig.pool.idle.append(second)
    rig.answer_wait(None)
    forbidden(rig)
    assert rig.commands() == [("start", "second", UPSTREAM_HEAD, False, False), ("detach", "second"),
                              ("wait", "_paused")]
    rig.io.clock += 2 * GRANTS_RETRY
    rig.answer_wait(None)
    assert rig.commands() == [("wait", "_connected")]  # no connection left in the pool: a new one
    rig.answer_wait(third)
    answer(rig, third)
    assert rig.commands() == [("start", "third", UPSTREAM_HEAD, False, False),
                              ("write", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")]
    assert outcomes(caplog) == [(200, "answered")]


@pytest.mark.parametrize("case", ["grant older than the bound", "bound passed while trying", "body not whole",
                                  "the egress"])
async def test_a_403_that_no_grant_on_its_way_explains_is_passed_on(rig, case):
    bound = rig.state.limits.registry_catch_up
    granted_at(rig, rig.io.clock - (bound + 1 if case == "grant older than the bound" else 0))
    if case == "the egress":
        rig.listener.settles_grants = False
    relay = rig.relay("r")
    rig.pool.idle.append(relay)
    rig.listener.decisions.append(Admitted(UPSTREAM_HEAD, watch=False))
    if case == "body not whole":
        rig.serving.received(b"PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
    else:
        rig.serving.received(GET)
    if case == "bound passed while trying":
        forbidden(rig)
        rig.io.clock += bound
        rig.pool.idle.append(relay)
        rig.answer_wait(None)
    rig.commands()
    forbidden(rig)
    rig.serving.response_bytes(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 10\r\n\r\nForbidden!")
    assert rig.commands() == [("write", b"HTTP/1.1 403 Forbidden\r\nContent-Length: 10\r\n\r\nForbidden!")]


def test_fresh_grants_keep_when_each_grant_first_appeared(pki, issuer_key):
    fresh = FreshGrants()
    fresh.update(registry_for(pki, issuer_key), 100.0)
    fresh.update(registry_for(pki, issuer_key, generation=2, effective=("read-pods", "write-pods")), 105.0)
    assert fresh.settling_until("peer", {"read-pods"}, "shop", 2.0) == 102.0  # kept from the first registry
    assert fresh.settling_until("peer", {"read-pods", "write-pods"}, None, 2.0) == 107.0  # the newest counts
    assert fresh.settling_until("other", {"read-pods"}, None, 2.0) == 0.0
    fresh.update(registry_for(pki, issuer_key, generation=3, effective=()), 110.0)
    fresh.update(registry_for(pki, issuer_key, generation=4), 120.0)  # gone, then back: new again
    assert fresh.settling_until("peer", {"read-pods"}, None, 2.0) == 122.0


def test_the_engines_connection_overrides_no_behaviour_of_its_serving():
    """engine.Connection adds the I/O of the commands to a Serving and takes its events; a name it defines that
    a Serving has already would replace the behaviour (only the answer's bytes go straight to the transport)."""
    from gateway.engine import Connection

    behaviour = {name for klass in Serving.__mro__ if klass is not object for name in vars(klass)}
    overridden = (set(vars(Connection)) & behaviour) - {"__init__", "__slots__", "__doc__", "__module__",
                                                         "__qualname__", "response_bytes"}
    assert overridden == set()
