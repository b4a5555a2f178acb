"""Bounding MCP tool results: pure functions over the results, no engine."""

from __future__ import annotations

import json

import pytest

from sandbox_kernel.agent_sessions import CommandResult, Outcome
from sandbox_kernel.mcp_results import (
    Cut,
    cut_command,
    cut_outcome,
    fit,
    fitting_prefix,
    head_and_tail,
    json_size,
    result_size,
)
from sandbox_kernel.mcp_server import code_result, command_result

pytestmark = pytest.mark.fast

# Texts whose JSON is larger than they are: quotes, controls (six bytes each), UTF-8.
COSTLY = ['"' * 50_000, "\x01" * 50_000, "é" * 50_000, "a\\b\n" * 20_000]


@pytest.mark.parametrize("text", COSTLY)
def test_a_cut_text_fits_its_budget_in_json(text: str) -> None:
    for budget in (0, 100, 7_777, 40_000):
        prefix = fitting_prefix(text, budget)
        assert text.startswith(prefix) and json_size(prefix) <= budget
        kept, left_out = head_and_tail(text, budget)
        assert json_size(kept) <= max(budget, 80) and left_out > 0
    assert head_and_tail("short", 100) == ("short", 0)


LIMITS = [4_000, 100_000, 900_000]


@pytest.fixture(scope="module")
def flood() -> Outcome:
    """stdout, stderr, a long text result, a traceback and images, all far past every
    limit (made, and measured whole, once)."""
    outcome = Outcome(
        session="s",
        sandbox_id="sk-a",
        stdout="START" + '\x02"x' * 900_000 + "END",
        stderr="warn\n" * 200_000,
        outputs=[
            {"kind": "image", "mime": "image/png", "data": "A" * 2_000_000},
            {"kind": "text", "mime": "text/plain", "data": "é" * 500_000},
            {"kind": "image", "mime": "image/png", "data": "B" * 100},
        ],
        error={"ename": "E", "evalue": "v", "traceback": ["frame"] * 100_000},
    )
    assert result_size(code_result(outcome)) > 10 * max(LIMITS)
    return outcome


@pytest.mark.parametrize("limit", LIMITS)
def test_a_flood_of_every_kind_fits_one_result(flood: Outcome, limit: int) -> None:
    """A flood of every kind: the result fits, keeps each text's head and tail, and says
    what was cut."""
    outcome = flood
    cut = Cut(limit, saved="/workspace/.sandbox-kernel/outputs/x.txt")
    result = fit(lambda share: (code_result(cut_outcome(outcome, share, cut), cut), cut), limit)
    assert result is not None and result_size(result) <= limit
    structured = result.structured_content
    assert structured is not None
    assert structured["stdout"].startswith("START") and structured["stdout"].endswith("END")
    assert structured["cut"]["output_file"] == cut.saved
    assert cut.fields["stdout"] > 0 and cut.images >= 1
    said = json.dumps(result.model_dump(by_alias=True))
    assert "output cut to fit one result" in said and cut.saved in said


def test_a_command_keeps_both_streams_heads_and_tails() -> None:
    result = CommandResult(
        exit_code=0, stdout="".join(f"{i}\n" for i in range(500_000)), stderr="e" * 10
    )
    cut = Cut(50_000, unsaved="the workspace's disk is full")
    fitted = fit(lambda share: (command_result(cut_command(result, share, cut), cut), cut), 50_000)
    assert fitted is not None and result_size(fitted) <= 50_000
    data = fitted.structured_content
    assert data and data["stdout"].startswith("0\n1\n") and data["stdout"].endswith("499999\n")
    assert data["stderr"] == "e" * 10  # a short stream is never cut
    assert "could not be kept: the workspace's disk is full" in fitted.content[-1].text
