"""Sphinx configuration of the sandbox-kernel manual (MyST Markdown, furo theme).

The reference pages are generated from the code at build time by ``_ext/sk_reference``;
nothing generated is committed. Nothing here fetches from the network (no intersphinx),
so CI builds the site offline: ``sphinx-build -W --keep-going -b html docs OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

from sandbox_kernel import __version__  # noqa: E402  (the installed package's version)

project = "sandbox-kernel"
author = "sandbox-kernel contributors"
copyright = "sandbox-kernel contributors"
version = release = __version__

extensions = ["myst_parser", "sk_reference"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Option names (--all) and ids (sk-...) are written as they are typed, not typeset.
smartquotes = False

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"sandbox-kernel {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
