"""Every bound on a request, in one place. The REST schemas, the Python API's argument checks and
the README's bound list (``python -m calculator.limits``) read them from here, so the documented
bounds are the enforced ones. Model and GPU shapes are bounded by ``hardware_db.schema`` itself."""

from __future__ import annotations

MAX_TOKENS = 10_000_000
"""Prompt or output tokens of one request (and within the model's context window)."""
MAX_BATCH = 65_536
"""Concurrent sequences in one estimate or KV-cache query."""
MAX_PARALLEL = 64
"""tp or pp of one instance."""
MAX_EXPERT_PARALLEL = 512
"""ep or attention dp of one instance (wide expert parallelism: DeepSeek decodes at EP144 and EP320)."""
MAX_GPU_TYPES = 16
"""Candidate GPU types in one plan."""
MAX_CHUNK_BUDGETS = 8
"""Chunked-prefill token budgets searched in one plan."""
MAX_SAMPLES = 10_000
"""Empirical length samples per length distribution."""
MAX_SWEEP_POINTS = 64
"""Values in one estimate sweep."""
MAX_PLAN_SWEEP_POINTS = 12
"""Values in one plan sweep."""
MAX_HF_CONFIG_KEYS = 400
"""Keys of an inline Hugging Face config.json (top level and in text_config)."""
MAX_CONFIG_BYTES = 1_000_000
"""A config.json or calibration file read from disk."""
MAX_BODY_BYTES = 1_000_000
"""A REST request body, with or without Content-Length (413 beyond)."""
DEFAULT_DEADLINE_S = 5.0
"""Wall-clock budget of one REST request's computation (504 beyond); ``PDPLAN_DEADLINE_S`` or
``pdplan serve --deadline`` change it."""

BOUNDS: tuple[tuple[str, str], ...] = (
    ("prompt or output length", (f"≤ {MAX_TOKENS:,} tokens and within the model's context window "
                                 "(every length sample too)")),
    ("batch", f"≤ {MAX_BATCH:,}"),
    ("tp, pp", f"≤ {MAX_PARALLEL}"),
    ("ep, dp", f"≤ {MAX_EXPERT_PARALLEL}"),
    ("candidate GPU types per plan", f"≤ {MAX_GPU_TYPES}"),
    ("chunk budgets per plan", f"≤ {MAX_CHUNK_BUDGETS}"),
    ("length samples", f"≤ {MAX_SAMPLES:,} per distribution"),
    ("sweep values", f"≤ {MAX_SWEEP_POINTS} (≤ {MAX_PLAN_SWEEP_POINTS} for plans)"),
    ("inline config.json", f"≤ {MAX_HF_CONFIG_KEYS} keys; files ≤ {MAX_CONFIG_BYTES:,} bytes"),
    ("request body", f"≤ {MAX_BODY_BYTES:,} bytes (413), chunked or not"),
    ("computation per request", (f"≤ {DEFAULT_DEADLINE_S:g} s by default (504), stopped when exceeded or "
                                 "when the client disconnects")),
)


def markdown() -> str:
    """The bound list as a Markdown table (the README's copy is checked against it by a test)."""
    rows = "\n".join(f"| {what} | {bound} |" for what, bound in BOUNDS)
    return "| input | bound |\n|---|---|\n" + rows


if __name__ == "__main__":
    print(markdown())
