"""``bench/engine_probe.py``'s reading of engine steps from a token stream (the engine itself is exercised
by tests/test_engine_serving.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from engine_probe import role, steps_of

from calculator.enginebench.client import RequestRecord


def test_steps_are_read_from_tokens_that_arrive_together():
    """Two decodes step every 10 ms; a prompt's 200 ms step ends at 0.23 s with its first token, the
    decodes' tokens of that step arrive up to 1 ms apart (the API server streams them one by one). A
    last prompt arrives at 0.50 s to an idle engine and gets its first token at 0.52 s: a 20 ms step
    after 260 ms of idling, not a 280 ms step."""
    a = RequestRecord(0, 512, 5, 0.0, token_s=[0.010, 0.020, 0.030, 0.2305, 0.240])
    b = RequestRecord(1, 512, 5, 0.0, token_s=[0.0102, 0.0201, 0.0304, 0.2300, 0.2402])
    c = RequestRecord(2, 512, 2, 0.025, token_s=[0.2310, 0.2401])  # its prompt ran in the long step
    d = RequestRecord(3, 512, 1, 0.50, token_s=[0.52])
    s = steps_of([a, b, c, d])
    assert s["end"] == pytest.approx([0.0201, 0.0304, 0.2310, 0.2402, 0.52])
    assert s["duration"] == pytest.approx([0.0099, 0.0103, 0.2006, 0.0092, 0.02])
    assert s["idle"] == pytest.approx([0, 0, 0, 0, 0.2598])
    assert list(s["tokens"]) == [2, 2, 3, 3, 1]
    assert list(s["prompts"]) == [0, 0, 1, 0, 1]


def test_processes_are_named_by_role_without_their_paths():
    import os

    assert role(str(os.getpid()), "/some/where/python bench/engine_probe.py") == "client (this probe)"
    assert role("1", "VLLM::EngineCore") == "engine core"
    assert role("2", "/venv/bin/python -m vllm.entrypoints.openai.api_server --model /x") == "API server"
    assert role("3", "/usr/bin/top -b") == "other (top)"
