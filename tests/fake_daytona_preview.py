"""The fake Daytona's preview proxy: what serves a preview link's URL.

Daytona answers ``GET /sandbox/{id}/ports/{port}/preview-url`` with ``{sandboxId, url,
token}``: ``url`` is its proxy's address for that sandbox and port
(``{protocol}://{port}-{sandboxId}.{proxy domain}``) and ``token`` the sandbox's own
preview token. Its proxy routes by the request's host name, answers 401 to a request
without the token (``X-Daytona-Preview-Token``) and shows browsers a warning page first
unless ``X-Daytona-Skip-Preview-Warning: true`` comes with the request.

Names under a proxy domain cannot be resolved here (no DNS, no traffic off this
machine), so the fake gives each (sandbox, port) link a listener of its own on
127.0.0.1 and checks that requests name that listener as their host, as the real proxy
would need them to. Which requests get the warning page is an approximation (those that
accept text/html, as a browser's navigation does). The sandbox's port is reached at its
container's address on Docker's default bridge: a sandbox made with ``networkBlockAll``
has none here, so its previews answer 502 (the real proxy reaches it through its runner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

TOKEN = "X-Daytona-Preview-Token"
SKIP_WARNING = "X-Daytona-Skip-Preview-Warning"
WARNING_PAGE = (
    b"<!doctype html><title>Preview warning</title>"
    b"<p>You are about to visit a preview of a Daytona sandbox.</p>"
)
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
WS_OWN = {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"}


class PreviewProxy:
    """Listeners for preview links, made when a link is asked for; ``address(sandbox id)``
    says where a sandbox's container is (None: not running or no network), ``token(sandbox
    id)`` what its preview token is."""

    def __init__(
        self, address: Callable[[str], str | None], token: Callable[[str], str | None]
    ) -> None:
        self._address = address
        self._token = token
        self._links: dict[tuple[str, int], str] = {}
        self._runners: list[web.AppRunner] = []
        self.requests: list[tuple[str, int, str, str]] = []  # (sandbox, port, method, path)

    async def link(self, sandbox_id: str, port: int) -> str:
        """The URL of ``port`` of ``sandbox_id`` (one listener per link, made once)."""
        if (sandbox_id, port) not in self._links:
            app = web.Application(client_max_size=1 << 31)
            app.router.add_route("*", "/{tail:.*}", self._handler(sandbox_id, port))
            runner = web.AppRunner(app, auto_decompress=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._runners.append(runner)
            host, bound = runner.addresses[0][:2]
            self._links[(sandbox_id, port)] = f"http://{host}:{bound}"
        return self._links[(sandbox_id, port)]

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def _handler(self, sandbox_id: str, port: int) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append((sandbox_id, port, request.method, request.path_qs))
            own = self._links[(sandbox_id, port)].split("://", 1)[1]
            if request.headers.get("Host") != own:
                return web.Response(status=404, text=f"no preview at host {request.host}")
            expected = self._token(sandbox_id)
            if not expected or request.headers.get(TOKEN) != expected:
                return web.Response(status=401, text="Unauthorized: a preview token is required")
            if request.headers.get(
                SKIP_WARNING, ""
            ).lower() != "true" and "text/html" in request.headers.get("Accept", ""):
                return web.Response(body=WARNING_PAGE, content_type="text/html")
            loop = asyncio.get_running_loop()
            address = await loop.run_in_executor(None, self._address, sandbox_id)
            if address is None:
                return web.Response(status=502, text="the sandbox is not running")
            url = f"http://{address}:{port}{request.path_qs}"
            headers = _forwarded(request.headers)
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return await _websocket(request, url, headers)
            return await _http(request, url, headers)

        return handle


def _forwarded(incoming: Any) -> dict[str, str]:
    """The request's headers as the app gets them: no hop-by-hop ones, no credentials of
    Daytona's, and the app's own host."""
    drop = HOP_BY_HOP | WS_OWN | {"host", TOKEN.lower(), SKIP_WARNING.lower()}
    out: dict[str, str] = {}
    for name, value in incoming.items():
        if name.lower() not in drop:
            out[name] = f"{out[name]}, {value}" if name in out else value
    return out


async def _http(request: web.Request, url: str, headers: dict[str, str]) -> web.StreamResponse:
    body = request.content.iter_chunked(1 << 16) if request.body_exists else None
    timeout = aiohttp.ClientTimeout(total=None, connect=10)
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        try:
            upstream = await session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"the sandbox's port did not answer: {exc}")
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


async def _websocket(request: web.Request, url: str, headers: dict[str, str]) -> web.StreamResponse:
    offered = [
        p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
    ]
    headers.pop("Sec-WebSocket-Protocol", None)
    async with aiohttp.ClientSession() as session:
        try:
            upstream = await session.ws_connect(url, headers=headers, protocols=offered)
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"the sandbox's port refused: {exc}")
        client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else ())
        await client.prepare(request)

        async def pump(source: Any, sink: Any) -> None:
            async for message in source:
                if message.type == WSMsgType.TEXT:
                    await sink.send_str(message.data)
                elif message.type == WSMsgType.BINARY:
                    await sink.send_bytes(message.data)
                else:
                    break
            await sink.close()

        await asyncio.gather(pump(client, upstream), pump(upstream, client))
        return client
