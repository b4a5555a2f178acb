"""Values of settings as people write them, each checked with one line on what is wrong:
sizes with units (``10 MB``, ``512 MiB``, ``64g``), entries of the flavors table,
egress allowlists, tables and lists given as text (environment variables), and
traitlets' errors cut to their reason. :mod:`.config` puts them to use.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from traitlets import Bool, Float, Int, TraitError

from .agent.egress_rules import parse_entry

FLAVOR_KEYS = ("cpus", "memory", "disk")
FLAVOR_OPTIONAL = ("egress_allow",)  # replaces c.SandboxConfig.egress_allow for the flavor
FLAVOR_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
MIN_MEMORY = 64 << 20  # less and no interpreter starts
MIN_DISK = 64 << 20  # less and the sandbox's own files do not fit

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "m": 1 << 20,
    "g": 1 << 30,
    "t": 1 << 40,  # Docker's letters: binary
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)\s*([a-z]*)\s*")


def parse_size(text: str | int) -> int:
    """'10 MB', '10MB', '1.5GiB', '64g' (Docker's binary letters), '10_000_000' -> bytes.

    MB and GB are decimal (10 MB = 10,000,000 bytes), MiB and GiB binary, as everywhere
    else; raises TraitError naming the accepted forms.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value: float = text
    else:
        match = _SIZE.fullmatch(str(text).lower())
        if not match or match.group(2) not in _SIZE_UNITS:
            raise TraitError(
                f"{text!r} is not a size: write e.g. 10 MB, 512 MiB, 64g or a number of bytes"
            )
        value = float(match.group(1).replace("_", "")) * _SIZE_UNITS[match.group(2)]
    if not math.isfinite(value):
        raise TraitError(f"{text!r} is not a finite size; use 0 for no limit")
    if value < 0:
        raise TraitError(f"must be zero or more, got {text!r}")
    return int(value)


class ByteSize(Int):
    """An Int of bytes that also takes sizes with units, from files and the environment."""

    def validate(self, obj: Any, value: Any) -> int:
        if isinstance(value, str):
            value = parse_size(value)
        return super().validate(obj, value)

    def from_string(self, s: str) -> int:
        return parse_size(s)


def check_flavor(name: Any, entry: Any) -> dict[str, Any]:
    """One entry of the flavors table as {"cpus": float, "memory": bytes, "disk": bytes};
    TraitError naming the entry and what is wrong with it."""
    shown = f"flavor {name!r}"
    if not isinstance(name, str) or not FLAVOR_NAME.fullmatch(name):
        raise TraitError(f"{shown} is not a flavor name: use letters, digits, '-', '_' and '.'")
    if not isinstance(entry, Mapping):
        raise TraitError(
            f"{shown} must be a table like {{'cpus': 2, 'memory': '2G', 'disk': '20G'}}, "
            f"not {type(entry).__name__}"
        )
    unknown = sorted(set(map(str, entry)) - set(FLAVOR_KEYS) - set(FLAVOR_OPTIONAL))
    missing = [key for key in FLAVOR_KEYS if key not in entry]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
        raise TraitError(f"{shown} has {what}: give cpus, memory and disk (and egress_allow)")
    cpus = entry["cpus"]
    if isinstance(cpus, bool) or not isinstance(cpus, (int, float)):
        try:
            cpus = float(str(cpus))
        except ValueError:
            raise TraitError(f"{shown}: cpus {entry['cpus']!r} is not a number") from None
    if not math.isfinite(cpus) or cpus <= 0:
        raise TraitError(f"{shown}: cpus must be a number above 0, got {entry['cpus']!r}")
    sizes: dict[str, Any] = {"cpus": float(cpus)}
    for key, least in (("memory", MIN_MEMORY), ("disk", MIN_DISK)):
        raw = entry[key]
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise TraitError(f"{shown}: {key} {raw!r} is not a size: write e.g. '2G' or '512M'")
        try:
            size = parse_size(raw)
        except TraitError as exc:
            raise TraitError(f"{shown}: {key} {exc}") from None
        if size < least:
            raise TraitError(f"{shown}: {key} {raw!r} is too small; give at least {least >> 20}M")
        sizes[key] = size
    if "egress_allow" in entry:
        try:
            sizes["egress_allow"] = check_egress(entry["egress_allow"])
        except TraitError as exc:
            raise TraitError(f"{shown}: egress_allow {exc}") from None
    return sizes


def check_egress(entries: Any) -> list[str]:
    """An egress allowlist as its entries' text; TraitError naming the first bad entry
    and what an entry may be."""
    if isinstance(entries, str) or not isinstance(entries, (list, tuple)):
        raise TraitError(
            f"must be a list of names, *.domains, addresses and networks, not {entries!r}"
        )
    found = []
    for raw in entries:
        try:
            found.append(parse_entry(raw).text)
        except ValueError as exc:
            raise TraitError(str(exc)) from None
    return found


def json_table(text: str) -> Any:
    """A table setting given as text (an environment variable): JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        raise TraitError(
            'expected a JSON table, e.g. {"gpu": {"cpus": 8, "memory": "32G", "disk": "100G"}}'
        ) from None
    if not isinstance(value, dict):
        raise TraitError(f"expected a JSON table ({{...}}), not {type(value).__name__}")
    return value


def text_list(text: str) -> list[str]:
    """A list setting given as text (an environment variable): a JSON list, or words
    separated by commas or spaces."""
    if text.strip().startswith("["):
        try:
            value = json.loads(text)
        except ValueError:
            raise TraitError('expected a JSON list, e.g. ["pypi.org", "10.0.0.0/8"]') from None
        if not isinstance(value, list):
            raise TraitError("expected a JSON list")
        return value
    return [word for word in re.split(r"[,\s]+", text) if word]


def short_trait_error(exc: Exception, trait: Any) -> str:
    """traitlets' messages repeat the class and trait; keep only the reason."""
    if isinstance(trait, Bool):
        return "expected true or false"
    if isinstance(trait, (Float, Int)) and not isinstance(exc, TraitError):
        unit = next(
            (f" of {u}" for u in ("seconds", "minutes") if u in (trait.help or "").lower()), ""
        )
        return f"expected a number{unit}, e.g. {trait.default_value:g}"
    text = str(exc).strip()
    if "expected" in text and "trait of" in text:
        return "not an accepted value"
    return text.splitlines()[0] if text else type(exc).__name__
