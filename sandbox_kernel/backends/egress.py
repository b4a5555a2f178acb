"""What a sandbox with an egress allowlist is told, on every engine that runs the proxy.

Such a sandbox reaches the network only through the egress proxy
(:mod:`sandbox_kernel.agent.egress_proxy`), which its programs find on their own
loopback at :data:`PROXY_URL` through the usual proxy variables: pip, git and curl
need no setting. Where the proxy comes from is each engine's business (a container of
ours on Docker, a bubblewrap'd process of the host on the local backend).
"""

from __future__ import annotations

import hashlib

from .base import egress_label

PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
# What the sandbox's programs read to find the proxy (both spellings: curl reads only
# the lower-case http_proxy), and what they reach without it (their own loopback).
PROXY_ENV = {
    "HTTP_PROXY": PROXY_URL,
    "HTTPS_PROXY": PROXY_URL,
    "http_proxy": PROXY_URL,
    "https_proxy": PROXY_URL,
    "NO_PROXY": "localhost,127.0.0.1,::1",
    "no_proxy": "localhost,127.0.0.1,::1",
}


def digest(entries: tuple[str, ...] | list[str]) -> str:
    """A short name for an allowlist (the same list in any order gives the same one)."""
    return hashlib.sha256(egress_label(tuple(entries)).encode()).hexdigest()[:12]
