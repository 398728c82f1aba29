"""The server's connections: how many one client address and the whole process may hold, and how long a
request may take to arrive.

uvicorn keeps every connection it accepts, for as long as its request takes to come: 20,000 half-sent
requests from one address once held 20,000 file descriptors until accept() failed with "Too many open
files" (one traceback per attempt). Here the HTTP protocol itself is guarded, so the guard works however
the server runs (``python -m app``, several workers on one port, or a test's server on its own loop):

- a connection beyond PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT from its address, or beyond
  PREFIXDESK_MAX_CONNECTIONS in all, is closed as soon as it is accepted (a reset: its descriptor is
  freed at once), with one log line a second at most;
- the last PREFIXDESK_CONNECTIONS_RESERVED_PERCENT of the total is kept for new clients: once the process
  holds the rest, an address with PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT_WHEN_BUSY connections or more gets
  no more, so many addresses each at their own limit cannot fill the server against a fresh customer;
- a request whose headers and body have not all arrived PREFIXDESK_REQUEST_ARRIVAL_TIMEOUT_S after its
  first byte (or after the connection opened) is answered 408 and closed. Only the request's arrival is
  timed: an answer that streams for minutes (Gradio's SSE, /v1 streams) is never cut.

The address is the TCP peer. Behind a trusted reverse proxy every connection comes from the proxy, so
its connections count only against the total; the proxy limits each client (nginx ``limit_conn``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from collections import Counter

from app.core.callers import ProxyTrust
from app.log_text import RateLimitedLog
from app.settings import Settings, SettingsError

log = logging.getLogger(__name__)

FDS_RESERVED = 512  # descriptors kept for the engine, the database, logs and files when the total is derived


class ConnectionLimits:
    """Open connections by client address, for one server."""

    def __init__(self, *, per_client: int, total: int, trust: ProxyTrust, reserved_percent: int = 0,
                 per_client_when_busy: int = 0):
        self.per_client = per_client  # 0: no limit
        self.total = total
        self.num_unreserved = total - total * reserved_percent // 100  # past it, the server is busy
        self.per_client_when_busy = per_client_when_busy
        self._trust = trust
        self._open: Counter[str] = Counter()
        self.num_open = 0
        self._refused = RateLimitedLog(log)

    def admit(self, address: str) -> bool:
        """Count a new connection from ``address``; False (and one log line a second at most) when it is over
        a limit and must be closed."""
        if self.num_open >= self.total:
            self._refused("refused a connection from %s: the server has %d open (PREFIXDESK_MAX_CONNECTIONS)",
                          address, self.num_open)
            return False
        if self.per_client and self._open[address] >= self.per_client and not self._trust.trusts(address):
            self._refused("refused a connection from %s: it has %d open (PREFIXDESK_MAX_CONNECTIONS_PER_CLIENT)",
                          address, self._open[address])
            return False
        if (self.num_open >= self.num_unreserved and self._open[address] >= self.per_client_when_busy
                and not self._trust.trusts(address)):
            self._refused("refused a connection from %s: it has %d open and the server %d of %d, the rest kept for "
                          "new clients (PREFIXDESK_CONNECTIONS_RESERVED_PERCENT)",
                          address, self._open[address], self.num_open, self.total)
            return False
        self._open[address] += 1
        self.num_open += 1
        return True

    def release(self, address: str) -> None:
        self.num_open -= 1
        self._open[address] -= 1
        if not self._open[address]:
            del self._open[address]


def raise_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a container may refuse; the total below follows what is in force
            pass
    return soft


def total_connections(settings: Settings, file_limit: int) -> int:
    """PREFIXDESK_MAX_CONNECTIONS, or the file limit less FDS_RESERVED; raises SettingsError when it leaves
    the process fewer than FDS_RESERVED descriptors of its own."""
    room = file_limit - FDS_RESERVED
    if settings.max_connections > room:
        raise SettingsError(
            f"PREFIXDESK_MAX_CONNECTIONS is {settings.max_connections:,}, but this process may open {file_limit:,} "
            f"files and keeps {FDS_RESERVED} for the engine, the database and logs; lower it to at most {room:,} "
            "or raise the hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit)")
    if room < 16:
        raise SettingsError(f"this process may open only {file_limit:,} files; raise the hard limit (ulimit -Hn)")
    return settings.max_connections or room


def guarded_protocol(limits: ConnectionLimits, arrival_timeout_s: float) -> type:
    """uvicorn's httptools HTTP protocol with ``limits`` and the arrival timeout (uvicorn's ``http=``)."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    timed_out_log = RateLimitedLog(log)
    body = json.dumps({"detail": f"The request did not arrive within {arrival_timeout_s:g} s; send it again."},
                      separators=(",", ":")).encode()

    def timeout_response(default_headers: list[tuple[bytes, bytes]]) -> bytes:
        """The 408, with the headers uvicorn puts on every response (the security headers among them)."""
        return b"".join([STATUS_LINE[408], *(name + b": " + value + b"\r\n" for name, value in default_headers),
                         b"content-type: application/json\r\n",
                         b"content-length: " + str(len(body)).encode() + b"\r\n",
                         b"connection: close\r\n\r\n", body])

    class GuardedProtocol(HttpToolsProtocol):
        _address: str | None = None  # set once admitted
        _arrival: asyncio.TimerHandle | None = None
        _received = False  # bytes of the request being timed arrived

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            if not limits.admit(address):
                transport.abort()  # a reset frees the descriptor now, with no lingering close
                return
            self._address = address
            self._start_timer(received=False)

        def connection_lost(self, exc) -> None:
            self._stop_timer()
            if self._address is not None:
                limits.release(self._address)
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self._received = True
            super().data_received(data)

        def on_message_begin(self) -> None:
            if self._arrival is None:  # the first bytes of the next request on a kept-alive connection
                self._start_timer(received=True)
            super().on_message_begin()

        def on_message_complete(self) -> None:
            self._stop_timer()  # the request has arrived: its answer may take as long as it takes
            super().on_message_complete()

        def _start_timer(self, *, received: bool) -> None:
            self._received = received
            self._arrival = self.loop.call_later(arrival_timeout_s, self._arrival_timed_out)

        def _stop_timer(self) -> None:
            if self._arrival is not None:
                self._arrival.cancel()
                self._arrival = None

        def _arrival_timed_out(self) -> None:
            self._arrival = None
            if self.transport.is_closing():
                return
            if self._received and not (self.cycle and self.cycle.response_started):
                timed_out_log("closed a request from %s that did not arrive within %g s "
                              "(PREFIXDESK_REQUEST_ARRIVAL_TIMEOUT_S)", self._address, arrival_timeout_s)
                self.transport.write(timeout_response(self.server_state.default_headers))
            if self.cycle is not None:
                # The app's receive() sees the client gone; a route still reading the body ends quietly (RequestGuard).
                self.cycle.disconnected = True
            self.transport.close()

    return GuardedProtocol
