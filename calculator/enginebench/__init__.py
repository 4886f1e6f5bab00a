"""Validation of the serving model against a real engine under load (``pdplan validate --serving``).

A random-weight Llama with a word-level tokenizer (every word one token, so lengths are exact) is
served by vLLM's CPU build on 127.0.0.1; Poisson traffic streams through it at several rates for
each scheduler configuration (chunking off, two chunk budgets, prefill/decode disaggregation); the
unloaded step times measured in the same run calibrate a CPU "device", and ``calculator.serving.evaluate``
predicts every point. Modules: ``model`` (the model files and prompts), ``client`` (streaming load
generator), ``engine`` (the server processes), ``predict`` (calibration and predictions),
``runner`` (the whole run), ``report`` (markdown, JSON and plot).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EngineMissingError", "run"]


def __getattr__(name: str) -> Any:  # PEP 562: importing the package starts nothing
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
