"""The preview proxy's clients for apps whose port has no address on this host.

tornado's HTTP and WebSocket clients connect to an address. A local sandbox's port has
none the host could use: it is reached only with a socket made in the sandbox's own
network namespace (see the local backend's ``netns`` module). These clients take each
connection's socket from the engine's opener
(:attr:`~sandbox_kernel.backends.base.PortTarget.opener`) and leave everything after
the connection (HTTP, the WebSocket handshake and frames) to tornado.
"""

from __future__ import annotations

import asyncio
import datetime
import numbers
import socket
from collections.abc import Callable
from typing import Any, cast

from tornado import httpclient, httputil, websocket
from tornado.iostream import IOStream
from tornado.simple_httpclient import SimpleAsyncHTTPClient
from tornado.tcpclient import TCPClient

Opener = Callable[[], tuple[socket.socket, tuple[str, int]]]


class OpenedTCPClient(TCPClient):
    """A TCP client whose every connection is a socket the opener made (the host and
    port tornado asks for are the opener's own address, from the target's URL)."""

    def __init__(self, opener: Opener) -> None:
        super().__init__()
        self._opener = opener

    async def connect(
        self,
        host: str,
        port: int,
        af: socket.AddressFamily = socket.AF_UNSPEC,
        ssl_options: Any = None,
        max_buffer_size: int | None = None,
        source_ip: str | None = None,
        source_port: int | None = None,
        timeout: float | datetime.timedelta | None = None,
    ) -> IOStream:
        sock, address = await asyncio.to_thread(self._opener)
        stream = IOStream(sock, max_buffer_size=max_buffer_size)
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        try:
            if isinstance(timeout, numbers.Real):
                await asyncio.wait_for(stream.connect(address), max(float(timeout), 0.001))
            else:
                await stream.connect(address)
        except BaseException:
            stream.close()
            raise
        return stream


class OpenedHTTPClient(SimpleAsyncHTTPClient):
    """tornado's HTTP client over :class:`OpenedTCPClient`."""

    def initialize(self, opener: Opener, **kwargs: Any) -> None:  # type: ignore[override]
        super().initialize(**kwargs)
        self.tcp_client.close()
        self.tcp_client = OpenedTCPClient(opener)


class OpenedWebSocket(websocket.WebSocketClientConnection):
    """tornado's WebSocket client over :class:`OpenedTCPClient`: the client it makes
    for itself is closed unused, and every use finds the opener's."""

    def __init__(self, opener: Opener, request: httpclient.HTTPRequest, **kwargs: Any) -> None:
        self._opened = OpenedTCPClient(opener)
        super().__init__(request, **kwargs)

    @property
    def tcp_client(self) -> TCPClient:
        return self._opened

    @tcp_client.setter
    def tcp_client(self, value: TCPClient) -> None:
        if value is not self._opened:
            value.close()


def http_client(opener: Opener | None, **kwargs: Any) -> SimpleAsyncHTTPClient:
    """A new HTTP client: over the opener's sockets, or tornado's own without one."""
    if opener is None:
        return SimpleAsyncHTTPClient(force_instance=True, **kwargs)
    return OpenedHTTPClient(force_instance=True, opener=opener, **kwargs)


async def websocket_connect(
    opener: Opener | None, request: httpclient.HTTPRequest, **kwargs: Any
) -> websocket.WebSocketClientConnection:
    """``tornado.websocket.websocket_connect(request, **kwargs)``, over the opener's
    sockets when there is one."""
    if opener is None:
        return await websocket.websocket_connect(request, **kwargs)
    # As websocket_connect prepares its request: headers of tornado's kind, defaults filled.
    request.headers = httputil.HTTPHeaders(request.headers)
    filled = cast(
        httpclient.HTTPRequest,
        httpclient._RequestProxy(request, httpclient.HTTPRequest._DEFAULTS),
    )
    conn = OpenedWebSocket(opener, filled, **kwargs)
    return await conn.connect_future
