"""The shared beneath-walk (sandbox_kernel/agent/beneath.py) against what a sandbox
plants and swaps, won deterministically here by acting at the walk's own system calls
(no engine needed); and the in-sandbox file helper built on it, run as the host sends
it, refusing in the same words as the host's own walk."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sandbox_kernel.agent import beneath, program
from sandbox_kernel.agent.beneath import DIR_FLAGS, MAX_DEPTH, READ_FLAGS, Refused
from sandbox_kernel.errors import SandboxError
from sandbox_kernel.files import RemoteWorkspace, Workspace

pytestmark = pytest.mark.fast

# What opening a link as a folder without following it gives (Linux: ENOTDIR).
LINK_REFUSED = ("ELOOP", "ENOTDIR")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A workspace, beside a folder outside it that holds what must stay untouched."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("host secret")
    return tmp_path / "ws"


@pytest.fixture
def root_fd(root: Path) -> Any:
    fd = os.open(root, DIR_FLAGS)
    yield fd
    os.close(fd)


def outside_intact(root: Path) -> bool:
    return (root.parent / "outside" / "secret.txt").read_text() == "host secret"


def before_open(
    monkeypatch: pytest.MonkeyPatch, name: str, flags: int, act: Callable[[], None]
) -> None:
    """Run ``act`` (what the sandbox does) right before the walk opens ``name`` with
    ``flags``, once."""
    real_open = os.open
    done = []

    def sandbox_first(path: Any, mode: int, *args: Any, **kwargs: Any) -> int:
        if path == name and mode == flags and not done:
            done.append(True)
            act()
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", sandbox_first)


def swap_for_link(folder: Path, target: Path) -> Callable[[], None]:
    """The sandbox's move: ``folder`` renamed away, a link to ``target`` in its place."""

    def act() -> None:
        folder.rename(folder.with_name(folder.name + "-moved"))
        folder.symlink_to(target)

    return act


def test_walk_refuses_a_link_on_the_way(root: Path, root_fd: int) -> None:
    (root / "a").symlink_to(root.parent / "outside")
    with pytest.raises(Refused) as refused:
        beneath.walk(root_fd, ["a"])
    assert refused.value.code in LINK_REFUSED


def test_walk_refuses_a_link_planted_mid_path(
    root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox swaps the next folder for a link after the walk passed the one
    before it: the open of that component refuses it, and nothing is made beyond."""
    (root / "a" / "b").mkdir(parents=True)
    before_open(
        monkeypatch, "b", DIR_FLAGS, swap_for_link(root / "a" / "b", root.parent / "outside")
    )
    with pytest.raises(Refused) as refused:
        beneath.walk(root_fd, ["a", "b", "c"], which="dst", create=True)
    assert refused.value.code in LINK_REFUSED and refused.value.which == "dst"
    assert sorted(p.name for p in (root.parent / "outside").iterdir()) == ["secret.txt"]


def test_walk_stays_in_the_folder_it_entered(
    root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder swapped for a link after the walk entered it: the walk goes on in the
    folder it holds (now ``a-moved``), never through the link."""
    (root / "a" / "b").mkdir(parents=True)
    (root.parent / "outside" / "b").mkdir()
    before_open(monkeypatch, "b", DIR_FLAGS, swap_for_link(root / "a", root.parent / "outside"))
    fd = beneath.walk(root_fd, ["a", "b"])
    try:
        assert os.fstat(fd).st_ino == (root / "a-moved" / "b").stat().st_ino
    finally:
        os.close(fd)


def test_open_regular_refuses_a_fifo_without_blocking(root: Path, root_fd: int) -> None:
    os.mkfifo(root / "pipe")
    with pytest.raises(Refused) as refused:
        beneath.open_regular(root_fd, "pipe")
    assert (refused.value.code, refused.value.details["kind"]) == ("notfile", "other")


def test_open_regular_refuses_a_fifo_swapped_in_after_the_look(
    root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is regular when looked at and a FIFO when opened: the open does not
    wait for a writer (it would hang here otherwise) and the descriptor is refused."""
    (root / "data").write_text("x")

    def to_fifo() -> None:
        (root / "data").unlink()
        os.mkfifo(root / "data")

    before_open(monkeypatch, "data", READ_FLAGS, to_fifo)
    with pytest.raises(Refused) as refused:
        beneath.open_regular(root_fd, "data")
    assert refused.value.code == "notfile"


def test_remove_refuses_a_tree_too_deep_and_keeps_it(root: Path, root_fd: int) -> None:
    deepest = root.joinpath("top", *["d"] * (MAX_DEPTH + 1))
    deepest.mkdir(parents=True)
    with pytest.raises(Refused) as refused:
        beneath.remove(root_fd, "top", "top")
    assert (refused.value.code, refused.value.details["limit"]) == ("deep", MAX_DEPTH)
    assert deepest.is_dir()


def test_remove_takes_links_not_their_targets(root: Path, root_fd: int) -> None:
    (root / "top" / "sub").mkdir(parents=True)
    (root / "top" / "sub" / "out").symlink_to(root.parent / "outside")
    (root / "top" / "secret").symlink_to(root.parent / "outside" / "secret.txt")
    beneath.remove(root_fd, "top", "top")
    assert not (root / "top").exists()
    assert outside_intact(root)


def test_remove_stops_at_a_folder_swapped_for_a_link(
    root: Path, root_fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    (root / "top" / "sub").mkdir(parents=True)
    (root / "top" / "sub" / "f").write_text("f")
    before_open(
        monkeypatch, "sub", DIR_FLAGS, swap_for_link(root / "top" / "sub", root.parent / "outside")
    )
    with pytest.raises(Refused) as refused:
        beneath.remove(root_fd, "top", "top")
    assert (refused.value.code, refused.value.details["shown"]) == ("changed", "top/sub")
    assert outside_intact(root)


def test_a_temporary_replaced_before_it_lands_is_refused(root: Path, root_fd: int) -> None:
    (root / "target").write_text("old")
    with beneath.Temporary(root_fd) as temporary:
        temporary.write(b"new")
        planted = root / temporary.name
        planted.unlink()
        planted.symlink_to(root.parent / "outside" / "secret.txt")
        with pytest.raises(Refused) as refused:
            temporary.land("target")
    assert (refused.value.code, refused.value.details["how"]) == ("interfered", "replaced")
    assert (root / "target").read_text() == "old"
    assert planted.is_symlink() and outside_intact(root)


def test_place_lands_whole_or_not_at_all(root: Path, root_fd: int) -> None:
    (root / "src").write_bytes(b"0123456789")
    fd = os.open(root / "src", os.O_RDONLY)
    try:
        beneath.place(root_fd, "copy", fd, 10)
        with pytest.raises(Refused) as refused:
            beneath.place(root_fd, "longer", fd, 5)  # the source is at its end: it "shrank"
    finally:
        os.close(fd)
    assert refused.value.code == "shrank"
    assert sorted(p.name for p in root.iterdir()) == ["copy", "src"]
    assert (root / "copy").read_bytes() == b"0123456789"


class LocalHelper:
    """Runs the file helper's program here, as the host would run it in a files sandbox
    (the Daytona engine itself is not involved: test_daytona_files covers it)."""

    def exec(self, sandbox_id: str, command: list[str], cwd: str, timeout: float) -> Any:
        done = subprocess.run(command, cwd=cwd, timeout=timeout, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
        return SimpleNamespace(output=done.stdout)


def test_the_helper_refuses_in_the_host_walks_words(root: Path) -> None:
    """The helper, sent as its bundle with the shared walk, refuses what the host walk
    refuses, and the host says it in the same words and with the same error class."""
    (root / "folder").mkdir()
    os.mkfifo(root / "pipe")
    (root / "file").write_text("x")
    (root / "link").symlink_to(root.parent / "outside")
    host, remote = Workspace(root), RemoteWorkspace(LocalHelper(), "local", str(root))
    situations: list[Callable[[Any], object]] = [
        lambda ws: ws.delete("folder"),
        lambda ws: ws.open_read("pipe"),
        lambda ws: ws.copy_file("pipe", "copy"),
        lambda ws: ws.copy_file("file", "folder"),
        lambda ws: ws.make_folder("folder"),
        lambda ws: ws.move("folder", "folder/inside"),
        lambda ws: ws.stat("missing"),
    ]
    for situation in situations:
        errors = []
        for ws in (host, remote):
            with pytest.raises(SandboxError) as raised:
                situation(ws)
            errors.append((type(raised.value).__name__, str(raised.value)))
        assert errors[0] == errors[1]
    assert outside_intact(root)


def test_the_helper_bundle_carries_the_walk(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    command = program("fs_helper", "remove", str(root), "a")
    answer = json.loads(subprocess.run(command, capture_output=True, check=True).stdout)
    assert answer == {"ok": True}
    assert list(root.iterdir()) == []
