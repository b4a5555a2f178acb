"""The pure parts of previews, without an engine: the ports read from a sandbox's TCP
tables (any process of the sandbox could have written what is parsed), and Daytona's
preview links as our proxy uses them (tests/test_daytona_preview.py drives the real SDK
through a real Jupyter server; tests/test_preview.py reads real tables)."""

from __future__ import annotations

import pytest

from sandbox_kernel.backends.base import PortTarget, SandboxFailed
from sandbox_kernel.backends.daytona.preview import (
    LINK_SECONDS,
    MAX_LINKS,
    PreviewLinks,
    preview_target,
)
from sandbox_kernel.preview import listening_ports

pytestmark = pytest.mark.fast

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"


def tcp(address: str, port: int, state: str = "0A", uid: int = 1000) -> str:
    """One line of /proc/net/tcp{,6} (addresses as the kernel writes them)."""
    return f"   0: {address}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 {uid}"


def test_listening_ports_from_the_tables() -> None:
    text = "\n".join(
        [
            HEADER,
            tcp("00000000", 8000),  # 0.0.0.0
            tcp("0100007F", 5432),  # 127.0.0.1
            tcp("0200007F", 5433),  # 127.0.0.2: loopback too
            tcp("0B00007F", 45637, uid=0),  # 127.0.0.11: Docker's DNS resolver
            tcp("0100007F", 8501),  # 8501 on loopback and...
            tcp("00000000000000000000000000000000", 8501),  # ... on :: too
            tcp("00000000000000000000000001000000", 6006),  # ::1
            tcp("0000000000000000FFFF00000100007F", 7000),  # ::ffff:127.0.0.1
            tcp("00000000", 9000, state="01"),  # an established connection, not a listener
            tcp("zz", 1),
            "garbage",
            tcp("00000000", 0),
        ]
    )
    found = {p.port: (p.address, p.reachable) for p in listening_ports(text)}
    assert found == {
        5432: ("127.0.0.1", False),
        5433: ("127.0.0.2", False),
        6006: ("::1", False),
        7000: ("127.0.0.1", False),
        8000: ("0.0.0.0", True),
        8501: ("::", True),
    }
    assert [p.port for p in listening_ports(text)] == sorted(found)


def test_a_link_becomes_a_target_with_its_host_and_token() -> None:
    target = preview_target("https://8000-4f1c.proxy.daytona.works/", "tok")
    assert target.url == "https://8000-4f1c.proxy.daytona.works"
    assert target.headers == {
        "Host": "8000-4f1c.proxy.daytona.works",
        "X-Daytona-Skip-Preview-Warning": "true",
        "X-Daytona-Preview-Token": "tok",
    }
    assert preview_target("http://127.0.0.1:4000", "").headers["Host"] == "127.0.0.1:4000"
    for bad in ("ftp://x/", "8000-4f1c.proxy.daytona.works", "https://user@x/", "http:///x"):
        with pytest.raises(SandboxFailed, match="proxy settings"):
            preview_target(bad, "tok")


def test_links_are_kept_per_start_for_a_while() -> None:
    now = [100.0]
    links = PreviewLinks(clock=lambda: now[0])
    asked: list[int] = []

    def fetch(n: int) -> PortTarget:
        asked.append(n)
        return PortTarget(f"http://h{n}")

    assert links.get(("box", 8000, 1.0), lambda: fetch(1)).url == "http://h1"
    assert links.get(("box", 8000, 1.0), lambda: fetch(2)).url == "http://h1"
    assert links.get(("box", 8000, 2.0), lambda: fetch(3)).url == "http://h3"  # restarted
    now[0] += LINK_SECONDS
    assert links.get(("box", 8000, 1.0), lambda: fetch(4)).url == "http://h4"  # expired
    assert asked == [1, 3, 4]
    for n in range(MAX_LINKS + 10):
        links.get(("box", n + 1, 1.0), lambda n=n: fetch(n))
    assert len(links._links) <= MAX_LINKS
