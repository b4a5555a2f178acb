"""The manual follows the code: its generated reference names every setting, command,
option, route and tool there is, and the README's links lead somewhere.

The Sphinx build itself (``sphinx-build -W``) is a step of ``.ci/run``; these tests run
the generators without Sphinx, so they belong to the fast layer.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from jupyter_ext.app import SandboxExtension
from sandbox_kernel.cli import build_parser
from sandbox_kernel.config import ENV_PREFIX, PERSONAL, SandboxConfig

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ref() -> ModuleType:
    """docs/_ext/sk_reference.py, imported by path as Sphinx's conf.py does."""
    spec = importlib.util.spec_from_file_location(
        "sk_reference", ROOT / "docs" / "_ext" / "sk_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sk_reference"] = module
    spec.loader.exec_module(module)
    return module


def section(markdown: str, heading: str) -> str:
    """The text of one generated ``### heading`` section, up to the next target."""
    start = markdown.index(f"### {heading}\n")
    end = markdown.find("\n(", start)
    return markdown[start : end if end != -1 else len(markdown)]


def test_settings_page_names_every_setting(ref: ModuleType) -> None:
    page = ref.settings_markdown()
    names = SandboxConfig.class_trait_names(config=True)
    assert len(names) > 20
    for name in names:
        text = section(page, f"`{name}`")
        assert f"`{ENV_PREFIX}{name.upper()}`" in text
        assert ("decided by: personal" in text) == (name in PERSONAL), name
    # A computed default names its folder, not this machine's.
    assert "`<jupyter data dir>/sandbox-kernel/workspaces`" in section(page, "`workspace_root`")


def test_extension_settings_are_all_there(ref: ModuleType) -> None:
    page = ref.extension_settings_markdown()
    own = SandboxExtension.class_own_traits(config=True)
    assert {"owner_from", "terminals", "gc_interval", "max_upload_size"} <= set(own)
    # Its own settings, none inherited from ExtensionApp (open_browser, default_url, ...).
    assert set(re.findall(r"`c\.SandboxExtension\.(\w+)`", page)) == set(own)


def test_cli_page_names_every_command_and_option(ref: ModuleType) -> None:
    page = ref.cli_markdown()
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"list", "exec", "shell", "destroy", "stop", "start", "gc", "stats", "mcp"} <= set(
        commands.choices
    )
    for name, sub in commands.choices.items():
        text = section(page, f"`sandbox-kernel {name}`")
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}`" in text, (name, option)
            if not action.option_strings:
                assert f"`{action.metavar or action.dest}`" in text, (name, action.dest)


def test_rest_page_names_every_route_and_status(ref: ModuleType) -> None:
    page = ref.rest_markdown()
    spec = yaml.safe_load((ROOT / "jupyter_ext" / "openapi.yaml").read_text())
    routes = 0
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in ("get", "put", "post", "delete", "patch"):
                continue
            routes += 1
            text = section(page, f"`{method.upper()} {path}`")
            for status in op["responses"]:
                assert f"| `{status}` |" in text, (method, path, status)
    assert routes >= 15
    for schema in spec["components"]["schemas"]:
        assert f"### {schema}\n" in page


def test_mcp_page_names_every_tool_and_argument(ref: ModuleType) -> None:
    page = ref.mcp_markdown()
    _, tools = ref.list_mcp_tools()
    assert {
        "execute_code",
        "execute_command",
        "get_sessions",
        "stop_session",
        "list_files",
        "read_file",
        "write_file",
    } <= {t.name for t in tools}
    for tool in tools:
        text = section(page, f"`{tool.name}`")
        for argument in (tool.input_schema or {}).get("properties", {}):
            assert f"| `{argument}` |" in text, (tool.name, argument)


def test_a_block_is_replaced_and_an_unknown_one_named(ref: ModuleType) -> None:
    page = "# T\n\n## S\n\n```{sandbox-reference} extension-settings\n```\n\nafter\n"
    expanded = ref.expand(page)
    assert "{sandbox-reference}" not in expanded
    assert "`c.SandboxExtension.terminals`" in expanded and expanded.endswith("after\n")
    with pytest.raises(ValueError, match="no reference named 'nope'; known: cli, "):
        ref.expand("```{sandbox-reference} nope\n```\n")


def test_table_cells_cannot_break_a_table(ref: ModuleType) -> None:
    assert ref.cell("a | b <c> *d*\nnext") == "a \\| b \\<c> \\*d\\* next"
    assert ref.code("x|y") == "`x\\|y`"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_lead_to_files(name: str) -> None:
    """What renders links somewhere that exists (a commented-out picture does not render)."""
    text = re.sub(r"<!--.*?-->", "", (ROOT / name).read_text(), flags=re.DOTALL)
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    if name == "README.md":
        assert len(targets) > 20
    for target in targets:
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"{name} links to {target}, which does not exist"


def test_readme_gives_the_test_command_ci_runs() -> None:
    """The README's test command switches on every requirement .ci/run exports."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    required = re.findall(r"^export (SANDBOX_KERNEL_REQUIRE_\w+)=1$", ci, flags=re.MULTILINE)
    assert len(required) >= 4
    line = (
        " ".join(f"{name}=1" for name in required)
        + " python -m pytest -q -n 3 --dist loadfile tests"
    )
    assert line in readme
    # CI adds only reporting: the slowest tests, and every test's duration in its log folder.
    assert re.search(
        r"^python -m pytest -q -ra --durations=15 -n 3 --dist loadfile (--junitxml \S+ )?tests$",
        ci,
        flags=re.MULTILINE,
    )
    assert re.search(r"^sphinx-build -W --keep-going .* docs ", ci, flags=re.MULTILINE)
