"""The service under hostile connections, served as `ruler serve` serves it: thousands of idle connections,
headers that never end or never stop, a body far over the limit. Real sockets and HTTP on loopback, the
real service with the scripted judge."""

import contextlib
import http.client
import resource
import socket
import time

import pytest

from ruler_rl.service.connections import ConnectionLimits, GuardedH11Protocol
from tests.test_hostile_input import Service, body, runner, service_config, svc  # noqa: F401  (a fixture)

HALF = b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # headers never finished


@pytest.fixture(scope="module")
def many_files():
    """Room for a few thousand sockets in this process (the attacker's and the server's ends)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 6000 if hard == resource.RLIM_INFINITY else min(hard, 6000)
    if want < 4500:
        pytest.skip(f"needs about 4,500 open files, the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def idle(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """`n` connections that send half a request's headers and then nothing."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        s.sendall(HALF)
        socks.append(s)
    return socks


def open_on_server_side(socks: list[socket.socket]) -> int:
    """How many of `socks` the server still holds open (no EOF or reset waiting to be read)."""
    time.sleep(0.3)
    alive = 0
    for s in socks:
        s.setblocking(False)
        try:
            alive += s.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def answered_all(service, sock: socket.socket, within: float = 60.0) -> None:
    """Wait until the server is done with what `sock` sent: every pipelined request answered (the answers wait,
    unread, in the socket buffers) and nothing left to write, or its writes paused on the full buffers. Until
    then the connection is being served, which the limits rightly do not cut short: on a loaded machine the
    server can be in the middle of a request on every one of an address's connections, and a newcomer from that
    address then finds none to close and gets 503."""
    port = sock.getsockname()[1]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        registry = getattr(service.server.server_state, "ruler_connections", None)  # made by the first connection
        conn = next((c for c in list(registry.all if registry else ()) if c.client == ("127.0.0.1", port)), None)
        if conn is not None and (conn.flow.write_paused or (conn.awaiting_headers
                                                            and not conn.raw.get_write_buffer_size())):
            return
        time.sleep(0.02)
    raise AssertionError(f"the server was still answering the connection from port {port} after {within} s")


def held_by_server(service, socks: list[socket.socket]) -> int:
    """How many of `socks` the server holds open, as it counts them (a client that never reads cannot tell: the
    EOF of a closed connection waits behind the answers still in the server's socket buffer)."""
    ports = {s.getsockname()[1] for s in socks}
    time.sleep(0.3)
    return sum(c.client[1] in ports for c in list(service.server.server_state.connections) if c.client)


def answered_in_time(call, status: int = 200) -> None:
    """`call()` (a request) answers with `status` within 5 s."""
    started = time.monotonic()
    response = call()
    seconds = time.monotonic() - started
    assert response.status_code == status and seconds < 5, (response.status_code, seconds)


@contextlib.contextmanager
def serving(tmp_path, judge, limits: ConnectionLimits | None = None, *, plain: bool = False):
    """The service (`Service`), and a list for the test's sockets: they are closed, and the service stopped, after."""
    service = Service(service_config(tmp_path, judge), limits, plain=plain)
    held: list[socket.socket] = []
    try:
        yield service, held
    finally:
        for s in held:
            s.close()
        service.stop()


def test_authorised_requests_are_answered_under_2000_idle_connections_from_one_address(tmp_path, judge,
                                                                                       many_files):
    with serving(tmp_path, judge) as (service, held):
        held += idle(service.port, 2000)
        for _ in range(3):
            answered_in_time(lambda: service.get("/healthz"))
            answered_in_time(lambda: service.post("/v1/score", body()))
        # the flood evicted itself: the server holds at most --max-connections-per-ip of it
        assert open_on_server_side(held) <= ConnectionLimits().max_per_ip


def test_without_the_limits_the_same_flood_turns_every_answer_into_a_503(tmp_path, judge, many_files):
    """What the limits prevent: uvicorn's own protocol with the service's former settings."""
    with serving(tmp_path, judge, plain=True) as (service, held):
        held += idle(service.port, 1100)
        assert service.get("/healthz").status_code == 503


def test_headers_have_a_deadline_however_they_are_paced(tmp_path, judge):
    service = Service(service_config(tmp_path, judge), ConnectionLimits(header_timeout_s=0.5))
    try:
        for pace in (None, 0.1):  # half the headers at once, or a byte every 0.1 s
            with socket.create_connection(("127.0.0.1", service.port), timeout=5) as s:
                started = time.monotonic()
                if pace is None:
                    s.sendall(HALF)
                else:
                    s.settimeout(pace)
                    for byte in HALF:
                        s.sendall(bytes([byte]))
                        try:
                            if s.recv(1, socket.MSG_PEEK):
                                break
                        except TimeoutError:
                            pass
                    s.settimeout(5)
                answer = s.recv(4096).decode()
                assert answer.startswith("HTTP/1.1 408 Request Timeout"), answer
                assert "request headers not complete within 0.5 s" in answer
                assert 0.4 < time.monotonic() - started < 2.5
        # a kept-alive connection: the next request's headers have their own deadline
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() and conn.sock is not None
        conn.sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert conn.sock.recv(4096).startswith(b"HTTP/1.1 408")
        assert service.get("/healthz").status_code == 200
    finally:
        service.stop()


def test_oversized_headers_and_bodies_get_an_answer_not_a_reset(svc):  # noqa: F811  (the fixture)
    """With Python's own http.client, which sends everything before it reads the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    conn.putrequest("GET", "/healthz")
    conn.putheader("X-Padding", "a" * 1_000_000)
    conn.endheaders()
    big = conn.getresponse()
    assert big.status == 431 and big.read() == b"request headers over 65536 bytes"
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    conn.request("POST", "/v1/score", body=b"x" * 9_000_000,
                 headers={"Content-Type": "application/json", **svc.headers})
    over = conn.getresponse()
    assert over.status == 413 and b"request body over 1000000 bytes" in over.read()
    assert svc.post("/v1/score", body()).status_code == 200  # and the service keeps serving


def test_a_crowded_address_makes_room_from_its_own_idle_connections_only(tmp_path, judge):
    with serving(tmp_path, judge, ConnectionLimits(max_per_ip=8, max_connections=40)) as (service, held):
        other = idle(service.port, 8, source="127.0.0.2")
        mine = idle(service.port, 30)
        held += other + mine
        assert open_on_server_side(other) == 8  # another address's connections are left alone
        assert open_on_server_side(mine) == 8   # this address's oldest idle ones were closed to make room
        crowd = idle(service.port, 30, source="127.0.0.3")
        held += crowd
        # 40 in all: the oldest idle connections anywhere make room for the newest
        assert open_on_server_side(other) + open_on_server_side(mine) + open_on_server_side(crowd) <= 40
        assert open_on_server_side(crowd) == 8
        assert service.get("/healthz").status_code == 200


def test_serve_flags_reach_the_connection_limits(tmp_path, monkeypatch):
    import uvicorn

    from ruler_rl.cli import app as ruler_cli

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app, **kw))
    res = runner.invoke(ruler_cli, ["serve", "--db", str(tmp_path / "svc.db"), "--header-timeout", "3",
                                    "--max-connections-per-ip", "0", "--max-connections", "50"])
    assert res.exit_code == 0, res.output
    protocol = started["http"]
    assert issubclass(protocol, GuardedH11Protocol)
    assert protocol.limits == ConnectionLimits(header_timeout_s=3.0, max_per_ip=0, max_connections=50)
    assert started["limit_concurrency"] > 50
    res = runner.invoke(ruler_cli, ["serve", "--db", str(tmp_path / "svc.db"), "--max-connections", "0"])
    assert res.exit_code == 2 and "--max-connections" in res.output
    with pytest.raises(ValueError, match="header_timeout_s must be a number >= 0.01"):
        ConnectionLimits(header_timeout_s=0)


def test_upgrades_slow_bodies_and_stalled_readers_cannot_hold_the_slots(tmp_path, judge):
    """With 16 connections per address: WebSocket upgrade requests (no such route) leave nothing behind, and
    keyless requests whose body never comes, or whose answer is never read, are closed to make room."""
    with serving(tmp_path, judge, ConnectionLimits(max_per_ip=16, header_timeout_s=30)) as (service, held):
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
                s.sendall(b"GET /v1/score HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                          b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 ")
        assert service.get("/healthz").status_code == 200
        for _ in range(40):  # headers complete, body promised and never sent
            s = socket.create_connection(("127.0.0.1", service.port), timeout=10)
            s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n")
            held.append(s)
        for _ in range(40):  # many requests pipelined, answers never read
            s = socket.create_connection(("127.0.0.1", service.port), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 25)
            held.append(s)
            answered_all(service, s)
        answered_in_time(lambda: service.post("/v1/score", body()))
        assert held_by_server(service, held) <= 16


def test_an_idle_kept_alive_connection_is_closed_without_an_answer(tmp_path, judge):
    """Nothing of a next request arrived: no 408 that a pooled client could take for its next answer."""
    service = Service(service_config(tmp_path, judge), ConnectionLimits(header_timeout_s=0.5))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read()
        assert conn.sock.recv(4096) == b""  # closed after 0.5 s, nothing written
    finally:
        service.stop()
