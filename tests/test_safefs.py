"""safefs against races a sandbox can win deterministically here (no engine needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_kernel.errors import Conflict
from sandbox_kernel.safefs import TEMP_PREFIX, Beneath

pytestmark = pytest.mark.fast


def test_an_upload_whose_temporary_vanished_is_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox removes the upload's temporary file between the server's last check
    and its rename (the window a tight unlink-then-symlink loop hits): a 409 saying
    what happened, not a 404 for the file being uploaded, and nothing in place."""
    (tmp_path / "up").mkdir()
    upload = Beneath(tmp_path).start_write("up/target.bin")
    upload.write(b"data")
    (temporary,) = (p for p in (tmp_path / "up").iterdir() if p.name.startswith(TEMP_PREFIX))
    real_rename = os.rename

    def rename_after_the_sandbox(src: str, dst: str, **fds: int) -> None:
        temporary.unlink()  # what the sandbox does right then
        real_rename(src, dst, **fds)

    monkeypatch.setattr(os, "rename", rename_after_the_sandbox)
    with pytest.raises(Conflict, match="interfered with"):
        upload.commit()
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "up").iterdir()) == []
