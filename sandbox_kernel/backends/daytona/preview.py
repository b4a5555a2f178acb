"""A Daytona sandbox's ports, reached through Daytona's own preview proxy.

Daytona gives each port of a sandbox a preview link (``GET
/sandbox/{id}/ports/{port}/preview-url``: its proxy's URL for that sandbox and port, and
the sandbox's preview token). The token goes with every request as
``X-Daytona-Preview-Token``, from this server only: it never reaches the browser, whose
page talks to our proxy. Daytona's proxy routes by the URL's host name, so requests carry
that host, not the Jupyter server's; and it shows browsers a warning page first unless
``X-Daytona-Skip-Preview-Warning`` says not to (our proxy is the page's host, and has
already said whose sandbox this is).

Links are kept for a few minutes per sandbox start: a page's every asset is a request,
and asking Daytona's API for each would spend its rate limit. Another start of the
sandbox is another key, so a link is never used past the start it was given for.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable

from ..base import PortTarget, SandboxFailed

TOKEN_HEADER = "X-Daytona-Preview-Token"
SKIP_WARNING_HEADER = "X-Daytona-Skip-Preview-Warning"
LINK_SECONDS = 300.0  # how long one preview link is used before Daytona is asked again
MAX_LINKS = 512  # preview links kept in one process

# (Daytona's sandbox id, port, when that sandbox last started)
LinkKey = tuple[str, int, float]


def preview_target(url: str, token: str) -> PortTarget:
    """Where our proxy sends a port's requests, from Daytona's preview link (``url``,
    ``token``); a link that is not an http(s) URL of a host is Daytona's error, said so."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise SandboxFailed(
            f"Daytona gave a preview link that is not an http(s) URL of a host ({url[:100]!r}); "
            "check the proxy settings of your Daytona (its proxy domain and protocol)"
        )
    headers = {"Host": parts.netloc, SKIP_WARNING_HEADER: "true"}
    if token:
        headers[TOKEN_HEADER] = token
    return PortTarget(url.rstrip("/"), headers)


class PreviewLinks:
    """Preview links of this process, each used for :data:`LINK_SECONDS` at most."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._links: dict[LinkKey, tuple[PortTarget, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: LinkKey, fetch: Callable[[], PortTarget]) -> PortTarget:
        """The link kept for ``key``, or a new one from ``fetch()`` (not under the lock:
        another port's request never waits for this one's round trip)."""
        now = self._clock()
        with self._lock:
            kept = self._links.get(key)
            if kept is not None and kept[1] > now:
                return kept[0]
        target = fetch()
        with self._lock:
            if len(self._links) >= MAX_LINKS:
                for old in [k for k, (_, until) in self._links.items() if until <= now]:
                    del self._links[old]
                while len(self._links) >= MAX_LINKS:
                    del self._links[next(iter(self._links))]
            self._links[key] = (target, now + LINK_SECONDS)
        return target
