"""What stands between a TCP connection and HTTP: uvicorn's h11 protocol with the limits a public port needs
(`ConnectionLimits`), so connections that never finish their headers cannot crowd out the ones that do.

- **Header deadline**: a request's headers must arrive within `header_timeout_s` of the connection opening
  (or of the previous response on a kept-alive connection), however they are paced: 408, then closed.
- **Connections per client address and in all**: over `max_per_ip` from one address, or `max_connections` in
  all, a connection is closed to make room, oldest first among, in this order: those waiting for headers (idle,
  half-sent or kept alive, with nothing left to write to them), those whose request body is still arriving, and
  those whose client stopped reading their answer; only when none is left is the newcomer refused (503). An idle
  or slow flood thus evicts itself while clients that send their request promptly and read their answer are
  served. uvicorn's own `limit_concurrency` (503 for everyone once reached) sits above these limits.
  WebSocket upgrades are off (`ws="none"`: the service has no WebSocket route).
- **Clean refusals**: headers over `max_header_bytes` get 431, a malformed request 400; and when the server
  closes a connection while the client is still sending (those answers, a 413 for a body over the limit), it
  stops writing, reads and drops what keeps arriving for up to `linger_s` / `linger_bytes`, then closes (a
  lingering close, as nginx does): the client reads the answer instead of a connection reset.

Behind a reverse proxy every connection comes from the proxy's address: set `max_per_ip` to 0 (off) there and
let the proxy limit per client (README, "Serving on a public port").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ruler_rl.service.needs_serve  # noqa: F401  (first: a clear error without the serve extra)

# isort: split
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits `guarded_protocol` enforces; `ruler serve` flags of the same names set them."""

    header_timeout_s: float = 10.0     # a request's headers, from the connection (or the last response): 408
    max_per_ip: int = 256              # connections from one client address (0: no per-address limit)
    max_connections: int = 1000        # connections in all
    max_header_bytes: int = 64 * 1024  # a request line and headers: 431 beyond
    linger_s: float = 2.0              # after closing with the client still sending: read and drop this long
    linger_bytes: int = 64 * 1024 * 1024  # ... or this much

    def __post_init__(self):
        for name, low in (("header_timeout_s", 0.01), ("linger_s", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low:
                raise ValueError(f"{name} must be a number >= {low}, got {value!r}")
        for name, low in (("max_per_ip", 0), ("max_connections", 1), ("max_header_bytes", 1024), ("linger_bytes", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

    @property
    def limit_concurrency(self) -> int:
        """uvicorn's `limit_concurrency` above these limits: connections being closed still count there."""
        return self.max_connections + max(64, self.max_connections // 4)


def uvicorn_options(limits: ConnectionLimits) -> dict:
    """The `uvicorn.run` / `uvicorn.Config` keyword arguments that serve with `limits` (what `ruler serve` runs)."""
    return {"http": guarded_protocol(limits), "ws": "none", "limit_concurrency": limits.limit_concurrency,
            "h11_max_incomplete_event_size": limits.max_header_bytes, "timeout_keep_alive": 5}


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """An `H11Protocol` class enforcing `limits`, for `uvicorn.run(..., http=...)` / `uvicorn.Config(http=...)`."""
    if not isinstance(limits, ConnectionLimits):
        raise TypeError(f"guarded_protocol takes ConnectionLimits, got {type(limits).__name__}")
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class _Registry:
    """The open connections of one server, oldest first: in all and per client address."""

    def __init__(self):
        self.all: dict[GuardedH11Protocol, None] = {}
        self.by_ip: dict[str, dict[GuardedH11Protocol, None]] = {}

    def add(self, conn: GuardedH11Protocol) -> None:
        self.all[conn] = None
        if conn.ip is not None:
            self.by_ip.setdefault(conn.ip, {})[conn] = None

    def remove(self, conn: GuardedH11Protocol) -> None:
        self.all.pop(conn, None)
        mine = self.by_ip.get(conn.ip)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self.by_ip[conn.ip]


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` becomes a lingering close; all else passes."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol):
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        self._protocol._linger()

    def __getattr__(self, name):
        return getattr(self._transport, name)


def _waiting_for_headers(conn: GuardedH11Protocol) -> bool:
    """Between requests or within a request's headers, with nothing of an answer left to write."""
    return conn.awaiting_headers and not conn.raw.get_write_buffer_size()


def _sending_a_body(conn: GuardedH11Protocol) -> bool:
    """A request whose body is still arriving."""
    return not conn.awaiting_headers and conn.conn.their_state is h11.SEND_BODY


def _not_reading(conn: GuardedH11Protocol) -> bool:
    """A client that stopped reading its answer (the server's writes are paused on it)."""
    return conn.flow is not None and conn.flow.write_paused


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with `limits` (made by `guarded_protocol`)."""

    limits = ConnectionLimits()

    def __init__(self, config, server_state, app_state, _loop=None):
        super().__init__(config, server_state, app_state, _loop)
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        registry = getattr(server_state, "ruler_connections", None)
        if registry is None:
            registry = server_state.ruler_connections = _Registry()
        self.registry: _Registry = registry
        self.ip: str | None = None
        self.opened = time.monotonic()
        self.awaiting_headers = True
        self.heard = False  # a byte of the current request arrived
        self.header_timer: asyncio.TimerHandle | None = None
        self.lingering = False
        self.lingered_bytes = 0
        self.raw: asyncio.Transport | None = None

    # --- the connection's life -------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.raw = transport
        super().connection_made(_LingeringTransport(transport, self))
        self.ip = self.client[0] if self.client else None
        self.registry.add(self)
        self._arm_header_timer()
        self._make_room()

    def connection_lost(self, exc) -> None:
        self.registry.remove(self)
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # answered and closing: what the client still sends is read and dropped
            self.lingered_bytes += len(data)
            if self.lingered_bytes > self.limits.linger_bytes:
                self.raw.abort()
            return
        self.heard = True
        super().data_received(data)

    def eof_received(self):
        return None  # the transport closes (lingering or not, the client has stopped sending)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers arrived: the header deadline is met
            self.awaiting_headers = False
            self._disarm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.raw.is_closing() and not self.lingering and self.cycle is not None \
                and self.cycle.response_complete:
            self.awaiting_headers, self.heard = True, False  # kept alive: the next request's headers have
            self._arm_header_timer()                          # a deadline of their own

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 refused: 431 when the headers were too large, else 400."""
        too_large = len(self.conn.trailing_data[0]) > self.limits.max_header_bytes
        status, reason = (431, b"Request Header Fields Too Large") if too_large else (400, b"Bad Request")
        text = (f"request headers over {self.limits.max_header_bytes} bytes" if too_large else msg).encode()
        self._answer_and_close(status, reason, text)

    # --- limits --------------------------------------------------------------------------------------

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_deadline)

    def _disarm_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_deadline(self) -> None:
        self.header_timer = None
        if not self.awaiting_headers or self.raw.is_closing() or self.lingering:
            return
        if not self.heard:  # nothing of a request arrived: closed without an answer a pooled client could misread
            self.registry.remove(self)
            self.raw.close()
            return
        self._answer_and_close(408, b"Request Timeout", f"request headers not complete within "
                               f"{self.limits.header_timeout_s:g} s".encode())

    def _make_room(self) -> None:
        """Over a limit (from this address, or in all), close one other connection of that pool (`_evict_one`);
        when none may be closed, refuse this one."""
        cap = self.limits.max_per_ip
        if cap and self.ip is not None and len(self.registry.by_ip.get(self.ip, ())) > cap:
            self._evict_one(self.registry.by_ip[self.ip])
        if self in self.registry.all and len(self.registry.all) > self.limits.max_connections:
            self._evict_one(self.registry.all)

    def _evict_one(self, pool: dict) -> None:
        """Close the oldest connection of `pool` waiting for headers, else the oldest still receiving a body, else
        the oldest whose client stopped reading; with none of them, answer this one 503 and close it."""
        for evictable in (_waiting_for_headers, _sending_a_body, _not_reading):
            for conn in pool:  # oldest first
                if conn is not self and not conn.lingering and evictable(conn):
                    self.registry.remove(conn)
                    conn._disarm_header_timer()
                    conn.raw.abort()
                    return
        self.registry.remove(self)
        self._answer_and_close(503, b"Service Unavailable", b"too many connections")

    def handle_websocket_upgrade(self, event) -> None:
        self.registry.remove(self)  # never reached with ws="none"; a protocol taking over is not ours to count
        self._disarm_header_timer()
        super().handle_websocket_upgrade(event)

    def _answer_and_close(self, status: int, reason: bytes, text: bytes) -> None:
        """A complete response written outside h11 (the request is refused whatever state it reached), then a
        lingering close."""
        self._disarm_header_timer()
        self.raw.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                       b"content-length: %d\r\n\r\n%s" % (status, reason, len(text), text))
        self._linger()

    def _linger(self) -> None:
        """Close the connection once the client has stopped sending: stop writing (FIN), read and drop what
        still arrives, close on the client's EOF or after `linger_s` / `linger_bytes`. A lingering connection no
        longer counts against the limits (it ends by itself)."""
        raw = self.raw
        if raw is None or raw.is_closing() or self.lingering:
            return
        self.lingering = True
        self.registry.remove(self)
        self._disarm_header_timer()
        if not raw.can_write_eof() or self.limits.linger_s == 0:
            raw.close()
            return
        raw.write_eof()
        raw.resume_reading()
        self.loop.call_later(self.limits.linger_s, raw.close)
