"""Sizes as people read them, the same in every message, listing and log line.

Binary units (what Docker and the kernel's limits use); one decimal below ten, whole
numbers above: "512 MiB", "1.5 GiB", "12 GiB". Parsing sizes people write lives with
the settings (:func:`sandbox_kernel.setting_values.parse_size`).
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(n: float) -> str:
    """``n`` bytes as "1.5 GiB" (negative counts as nothing)."""
    value = float(max(n, 0))
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
    return f"{text.removesuffix('.0')} {unit}"


def cpus_words(n: float) -> str:
    """``n`` CPUs as "1 CPU", "2 CPUs", "0.5 CPUs"."""
    return f"{n:g} CPU" + ("" if n == 1 else "s")
