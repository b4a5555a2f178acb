"""Daytona's preview links as our proxy uses them (no engine: the links are made up here;
tests/test_daytona_preview.py drives the real SDK through a real Jupyter server)."""

from __future__ import annotations

import pytest

from sandbox_kernel.backends.base import PortTarget, SandboxFailed
from sandbox_kernel.backends.daytona.preview import (
    LINK_SECONDS,
    MAX_LINKS,
    PreviewLinks,
    preview_target,
)

pytestmark = pytest.mark.fast


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
