"""Reference pages written from the code at build time, so they cannot drift from it.

A page asks for one with a fenced block naming it::

    ```{sandbox-reference} cli
    ```

and this extension replaces the block with Markdown before MyST reads the page:

- ``settings``: ``SandboxConfig``'s traits (name, variable, type, default, who decides);
- ``extension-settings``: the server extension's own traits (``SandboxExtension``);
- ``cli``: every subcommand and option of ``sandbox-kernel``'s argparse parser;
- ``rest``: every route, parameter, response and schema of ``jupyter_ext/openapi.yaml``;
- ``mcp-tools``: every MCP tool as the server lists it (name, description, input schema).

The generators are plain functions returning Markdown, usable without Sphinx (the
fast tests check them against the code).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from traitlets import Bool, Dict, Enum, Float, Int, List, TraitType, Undefined, Unicode

if TYPE_CHECKING:
    from sphinx.application import Sphinx
    from sphinx.environment import BuildEnvironment

BLOCK = re.compile(r"^```\{sandbox-reference\}[ \t]+(\S+)[ \t]*\n```[ \t]*$", re.MULTILINE)


def cell(text: object) -> str:
    """Text made safe for one cell of a Markdown table (and for MyST prose)."""
    value = " ".join(str(text).split())
    for char in ("\\", "|", "<", "*"):
        value = value.replace(char, "\\" + char)
    return value


def code(text: object) -> str:
    """An inline code span holding ``text`` (table cells may hold a `|`)."""
    value = str(text).replace("|", "\\|")
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}" if fence == "`" else f"{fence} {value} {fence}"


def slug(*parts: str) -> str:
    """A target name for a generated heading (letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of already-escaped cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- settings --------------------------------------------------------------------------
def own_config_traits(cls: type) -> list[tuple[str, TraitType[Any, Any]]]:
    """The configurable traits ``cls`` itself defines, in the order of its source."""
    wanted = cls.class_own_traits(config=True)  # type: ignore[attr-defined]
    return [(name, wanted[name]) for name in vars(cls) if name in wanted]


def trait_type(trait: TraitType[Any, Any]) -> str:
    """What a trait accepts, in a reader's words."""
    if isinstance(trait, Enum):
        return "one of " + ", ".join(code(v) for v in trait.values or [])
    if isinstance(trait, Bool):
        return "true or false"
    if type(trait).__name__ == "ByteSize":
        return "a size: bytes, or e.g. `10 MB`, `512 MiB`, `64g`"
    if isinstance(trait, Int):
        return "integer"
    if isinstance(trait, Float):
        return "number"
    if isinstance(trait, List):
        return "list of text"
    if isinstance(trait, Unicode):
        return "text"
    return type(trait).__name__


def trait_default(cls: type, name: str, trait: TraitType[Any, Any]) -> str:
    """The default as a reader should see it; a computed default names its folder."""
    from jupyter_core.paths import jupyter_data_dir

    value: Any = trait.default_value
    if value is Undefined:  # a list's default is made anew for each instance
        value = trait.default()
    if name in getattr(cls, "_trait_default_generators", {}):
        instance = cls()
        value = instance.trait_defaults(name)
    if isinstance(value, str):
        data_dir = str(Path(jupyter_data_dir()))
        if value.startswith(data_dir):
            return code("<jupyter data dir>" + value[len(data_dir) :])
        return code(value) if value else "(none)"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, list):
        return code(json.dumps(value))
    if isinstance(value, float) and value.is_integer():
        return code(int(value))
    if isinstance(value, int) and value >= 1 << 20 and "byte" in (trait.help or "").lower():
        from sandbox_kernel.units import format_size

        return f"{code(value)} ({format_size(value)})"
    return code(value)


def settings_markdown() -> str:
    """Every ``SandboxConfig`` setting: a summary table, then one section each."""
    from sandbox_kernel.config import ENV_PREFIX, PERSONAL, SandboxConfig

    traits = own_config_traits(SandboxConfig)
    rows = []
    for name, trait in traits:
        who = "personal" if name in PERSONAL else "policy"
        rows.append(
            [
                f"{{ref}}`{name} <{slug('setting', name)}>`",
                code(ENV_PREFIX + name.upper()),
                trait_default(SandboxConfig, name, trait),
                who,
            ]
        )
    parts = [table(["setting", "environment variable", "default", "decided by"], rows)]
    for name, trait in traits:
        who = (
            "personal: the environment, a kernelspec's `env` and notebook metadata may set it"
            if name in PERSONAL
            else "policy: once a configuration file sets it, the environment cannot change it"
        )
        parts.append(
            "\n".join(
                [
                    f"({slug('setting', name)})=",
                    f"### `{name}`",
                    "",
                    cell(trait.help or ""),
                    "",
                    f"- configuration: `c.SandboxConfig.{name}`",
                    f"- environment: `{ENV_PREFIX}{name.upper()}`",
                    f"- type: {trait_type(trait)}{_as_variable(trait)}",
                    f"- default: {trait_default(SandboxConfig, name, trait)}",
                    f"- decided by: {who}",
                ]
            )
        )
    return "\n\n".join(parts) + "\n"


def _as_variable(trait: TraitType[Any, Any]) -> str:
    """How a setting's environment variable spells a value, where that is not plain."""
    if isinstance(trait, List):
        return " (as a variable: a JSON list, or words apart by commas or spaces)"
    if isinstance(trait, Dict):
        return " (as a variable: a JSON table)"
    return ""


def extension_settings_markdown() -> str:
    """The server extension's own settings (``c.SandboxExtension.*``)."""
    from jupyter_ext.app import SandboxExtension

    rows = [
        [
            code(f"c.SandboxExtension.{name}"),
            trait_type(trait),
            trait_default(SandboxExtension, name, trait),
            cell(trait.help or ""),
        ]
        for name, trait in own_config_traits(SandboxExtension)
    ]
    return table(["setting", "type", "default", "meaning"], rows) + "\n"


# -- the command line ------------------------------------------------------------------
@contextlib.contextmanager
def columns(width: int) -> Iterator[None]:
    """argparse wraps usage lines to the terminal; the pages use one width."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def argument_row(action: argparse.Action) -> list[str]:
    """One argument of a subcommand: how to write it, what it takes, what it does."""
    if action.option_strings:
        spelled = ", ".join(code(o) for o in action.option_strings)
    else:
        spelled = code(action.metavar or action.dest)
    if action.choices:
        takes = ", ".join(code(c) for c in action.choices)
    elif action.nargs == 0:
        takes = "(a switch)"
    elif action.nargs == argparse.REMAINDER:
        takes = "the rest of the line"
    else:
        takes = code(action.metavar or action.dest.upper())
    notes = []
    if not action.option_strings and action.nargs == "?":
        notes.append("optional")
    if action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
        notes.append(f"default {code(action.default)}")
    help_text = cell(action.help or "")
    if notes:
        help_text += f" ({'; '.join(notes)})"
    return [spelled, takes, help_text]


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the parser's order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def cli_markdown() -> str:
    """The ``sandbox-kernel`` command: a summary table, then every subcommand."""
    from sandbox_kernel.cli import build_parser

    with columns(88):
        parser = build_parser()
        found = subcommands(parser)
        parts = [
            cell(parser.description or ""),
            "```text\n" + parser.format_usage().strip() + "\n```",
            table(
                ["command", "does"],
                [[f"{{ref}}`{name} <{slug('cli', name)}>`", cell(h)] for name, h, _ in found],
            ),
        ]
        for name, _, sub in found:
            actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
            description = (sub.description or "").strip()
            parts.append(
                "\n\n".join(
                    [
                        f"({slug('cli', name)})=\n### `sandbox-kernel {name}`",
                        "\n\n".join(cell(p) for p in description.split("\n\n") if p.strip()),
                        "```text\n" + sub.format_usage().strip() + "\n```",
                        table(["argument", "takes", "meaning"], [argument_row(a) for a in actions]),
                    ]
                )
            )
    return "\n\n".join(parts) + "\n"


# -- the REST API ----------------------------------------------------------------------
def load_openapi() -> dict[str, Any]:
    """The OpenAPI description the server's handlers are tested against, as installed."""
    text = resources.files("jupyter_ext").joinpath("openapi.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A ``$ref`` followed within the file (other nodes as they are)."""
    while "$ref" in node:
        target: Any = spec
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_text(schema: dict[str, Any] | None) -> str:
    """A schema in a few words, with a link for a named component."""
    if not schema:
        return ""
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        name = ref.rsplit("/", 1)[1]
        return f"{{ref}}`{name} <{slug('rest', 'schema', name)}>`"
    if schema.get("type") == "array":
        return "array of " + schema_text(schema.get("items"))
    if schema.get("type") == "object" and schema.get("properties"):
        required = set(schema.get("required", []))
        fields = ", ".join(
            code(name) + ("" if name in required else " (optional)") + ": " + schema_text(sub)
            for name, sub in schema["properties"].items()
        )
        return "object: " + fields
    text = str(schema.get("type", "any"))
    if schema.get("enum"):
        text += " (" + ", ".join(code(v) for v in schema["enum"]) + ")"
    return text


def body_text(spec: dict[str, Any], body: dict[str, Any]) -> str:
    """A request or response body: its content types and schemas."""
    body = resolve(spec, body)
    content = body.get("content") or {}
    return "; ".join(
        code(kind) + (f": {schema_text(media.get('schema'))}" if media.get("schema") else "")
        for kind, media in content.items()
    )


def operation_markdown(spec: dict[str, Any], path: str, method: str, item: dict[str, Any]) -> str:
    """One route: summary, parameters, body, responses."""
    op = item[method]
    lines = [
        f"({slug('rest', method, path)})=",
        f"### `{method.upper()} {path}`",
        "",
        cell(op.get("summary", "")),
    ]
    params = [resolve(spec, p) for p in item.get("parameters", []) + op.get("parameters", [])]
    if params:
        lines += ["", "Parameters:", ""]
        lines += [
            f"- {code(p['name'])} ({p['in']}{', required' if p.get('required') else ''}): "
            + (cell(p["description"]) if p.get("description") else schema_text(p.get("schema")))
            for p in params
        ]
    if op.get("requestBody"):
        lines += ["", "Request body: " + body_text(spec, op["requestBody"])]
    rows = []
    for status, answer in op.get("responses", {}).items():
        full = resolve(spec, answer)
        body = body_text(spec, answer)
        rows.append(
            [code(status), cell(full.get("description", "")) + (f" ({body})" if body else "")]
        )
    lines += ["", table(["status", "answer"], rows)]
    return "\n".join(lines)


def rest_markdown() -> str:
    """Every route of ``openapi.yaml`` in file order, then its schemas (the file's own
    introduction is the page's, written for reading)."""
    spec = load_openapi()
    parts: list[str] = []
    methods = ("get", "put", "post", "delete", "patch")
    summary = [
        [
            f"{{ref}}`{method.upper()} {path} <{slug('rest', method, path)}>`",
            cell(item[method].get("summary", "")),
        ]
        for path, item in spec["paths"].items()
        for method in methods
        if method in item
    ]
    parts.append(table(["route", "does"], summary))
    for path, item in spec["paths"].items():
        parts += [operation_markdown(spec, path, m, item) for m in methods if m in item]
    parts.append("## Schemas")
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        rows = [
            [code(field), schema_text(sub), cell(sub.get("description", ""))]
            for field, sub in (schema.get("properties") or {}).items()
        ]
        parts.append(
            f"({slug('rest', 'schema', name)})=\n### {name}\n\n"
            + table(["field", "type", "meaning"], rows)
        )
    return "\n\n".join(parts) + "\n"


# -- MCP tools -------------------------------------------------------------------------
def list_mcp_tools() -> tuple[str, list[Any]]:
    """The server's instructions and its tools, as a client's ``tools/list`` gets them.

    The server is the real one (``build_server``) over a service whose state folder is
    a temporary one; listing tools reaches no engine.
    """
    from sandbox_kernel.agent_sessions import AgentSessions
    from sandbox_kernel.config import SandboxConfig
    from sandbox_kernel.mcp_server import INSTRUCTIONS, build_server
    from sandbox_kernel.service import SandboxService

    with tempfile.TemporaryDirectory(prefix="sk-docs-") as state:
        config = SandboxConfig(state_dir=state, workspace_root=str(Path(state) / "workspaces"))
        sessions = AgentSessions(SandboxService(config), home=state)
        server = build_server(sessions, lambda _ctx: "docs")
        tools = asyncio.run(server.list_tools())
    return INSTRUCTIONS, list(tools)


def property_type(schema: dict[str, Any]) -> str:
    """A JSON schema property's type in a few words (pydantic writes unions as anyOf)."""
    if "anyOf" in schema:
        return " or ".join(property_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(code(v) for v in schema["enum"])
    if "const" in schema:
        return code(schema["const"])
    return str(schema.get("type", "any"))


def first_sentence(text: str | None) -> str:
    """The first sentence of a description, for a summary table."""
    head = (text or "").split(". ")[0].strip()
    return head if head.endswith(".") else head + "."


def mcp_markdown() -> str:
    """Every MCP tool: what it does, its arguments, its hints."""
    instructions, tools = list_mcp_tools()
    parts = [
        "The server's instructions to the agent:",
        "\n".join("> " + line for line in instructions.splitlines()),
        table(
            ["tool", "does"],
            [
                [f"{{ref}}`{t.name} <{slug('mcp', t.name)}>`", cell(first_sentence(t.description))]
                for t in tools
            ],
        ),
    ]
    for tool in tools:
        schema = tool.input_schema or {}
        required = set(schema.get("required", []))
        rows = [
            [
                code(name),
                property_type(prop),
                "yes" if name in required else "no",
                code(json.dumps(prop["default"])) if "default" in prop else "",
                cell(prop.get("description", "")),
            ]
            for name, prop in (schema.get("properties") or {}).items()
        ]
        hints = tool.annotations
        flags = []
        if hints is not None:
            if hints.read_only_hint:
                flags.append("read-only")
            if hints.destructive_hint:
                flags.append("destructive")
        section = [
            f"({slug('mcp', tool.name)})=\n### `{tool.name}`",
            cell(tool.description or ""),
            table(["argument", "type", "required", "default", "meaning"], rows)
            if rows
            else "No arguments.",
        ]
        if flags:
            section.append("Hints: " + ", ".join(flags) + ".")
        parts.append("\n\n".join(section))
    return "\n\n".join(parts) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_markdown,
    "extension-settings": extension_settings_markdown,
    "cli": cli_markdown,
    "rest": rest_markdown,
    "mcp-tools": mcp_markdown,
}


def expand(text: str) -> str:
    """``text`` with every ``{sandbox-reference}`` block replaced by its Markdown."""

    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"no reference named {name!r}; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()

    return BLOCK.sub(generate, text)


# -- Sphinx ----------------------------------------------------------------------------
def _source_read(app: Sphinx, docname: str, source: list[str]) -> None:
    from sphinx.errors import ExtensionError

    try:
        source[0] = expand(source[0])
    except ValueError as exc:
        raise ExtensionError(f"{docname}: {exc}") from None


def _always_outdated(
    app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str], removed: set[str]
) -> list[str]:
    """Generated pages follow the code, which Sphinx does not watch: read them every build."""
    return [
        name
        for name in env.found_docs
        if "{sandbox-reference}" in Path(env.doc2path(name)).read_text(encoding="utf-8")
    ]


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the generators with Sphinx."""
    app.connect("source-read", _source_read)
    app.connect("env-get-outdated", _always_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
