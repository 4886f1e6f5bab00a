"""Speculative decoding: a draft network proposes ``tokens`` next tokens, the target verifies them
in one step, and the accepted prefix plus the target's own token are emitted.

Three drafts, as engines ship them (vLLM, SGLang, TensorRT-LLM):

* ``mtp``: the model's own multi-token-prediction module (DeepSeek-V3/R1): one extra transformer
  layer of the model's kind (an MoE layer for DeepSeek) sharing its embedding and LM head;
* ``eagle``: an EAGLE-style head: one dense decoder layer of the target's width with an LM head;
* ``draft``: a separate, smaller model of the same tokenizer (``draft_model``), on the same GPUs.

A step costs one verify step of the target (``tokens`` + 1 new tokens per sequence over the cached
context) plus ``tokens`` steps of the draft; it emits (1 - a^(k+1)) / (1 - a) tokens per sequence
with per-token acceptance a (``spec_tokens_per_step``). The draft's weights and KV cache take
memory from the target's KV budget.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hardware_db.loader import load_model
from hardware_db.schema import ModelSpec

from . import formulas as f
from .errors import InputError
from .phases import Group, Setup, step_groups

SpecKind = Literal["mtp", "eagle", "draft"]


class Speculation(BaseModel):
    """A speculative-decoding configuration of a pool (or an estimate)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: SpecKind = Field(description="mtp (the model's multi-token-prediction layer), eagle (a one-layer head), "
                                       "or draft (a separate draft_model)")
    tokens: int = Field(default=3, ge=1, le=16, description="draft tokens proposed per step")
    acceptance: float = Field(default=0.7, gt=0, lt=1, description="probability that each draft token is "
                              "accepted (its predecessors accepted); DeepSeek reports 0.85-0.9 for MTP's first "
                              "token")
    draft_model: str | None = Field(default=None, max_length=128, description="kind draft: the draft model's id")

    @model_validator(mode="after")
    def _draft(self) -> Speculation:
        if self.kind == "draft" and self.draft_model is None:
            raise ValueError("draft_model: a draft speculation names its draft model")
        if self.kind != "draft" and self.draft_model is not None:
            raise ValueError(f"draft_model: only kind 'draft' takes one (got kind {self.kind!r})")
        return self

    @property
    def tokens_per_step(self) -> float:
        """Tokens a step emits per sequence (``spec_tokens_per_step``)."""
        return float(f.spec_tokens_per_step(a_acc=self.acceptance, n_draft=self.tokens))


@lru_cache(maxsize=256)
def draft_model_spec(target: ModelSpec, spec: Speculation) -> ModelSpec:
    """The draft network as a model: one layer of the target's kind (mtp), one dense layer (eagle), or
    the named draft model (which must share the target's vocabulary)."""
    if spec.kind == "draft":
        try:
            d = load_model(spec.draft_model)  # type: ignore[arg-type]
        except InputError as e:
            raise InputError("spec.draft_model", e.reason) from None
        if d.vocab_size != target.vocab_size:
            raise InputError("spec.draft_model", f"{d.id}'s vocabulary ({d.vocab_size:,}) differs from {target.id}'s "
                                                 f"({target.vocab_size:,}): a draft must share the tokenizer")
        from .params import active_param_count

        drafted, targeted = active_param_count(d), active_param_count(target)
        if drafted >= targeted:
            raise InputError("spec.draft_model", f"{d.id} ({drafted / 1e9:.1f}B active parameters) is not smaller than "
                                                 f"{target.id} ({targeted / 1e9:.1f}B): a draft that costs as much as the "
                                                 "target per token cannot speed it up")
        return d
    if spec.kind == "mtp" and target.mtp_layers == 0:
        raise InputError("spec.kind", f"{target.id} has no multi-token-prediction layer (its config.json has no "
                                      "num_nextn_predict_layers); use eagle or draft")
    one = {"num_layers": 1, "num_sliding_layers": 0, "sliding_window": None, "id": f"{target.id}-{spec.kind}"}
    if spec.kind == "mtp" and target.moe is not None:
        return target.model_copy(update={**one, "moe": target.moe.model_copy(update={"num_dense_layers": 0})})
    return target.model_copy(update={**one, "moe": None})


@lru_cache(maxsize=256)
def draft_setup(setup: Setup, spec: Speculation) -> Setup:
    """The draft on the target's GPUs: the same tensor parallelism; an MTP layer of an MoE model keeps
    the target's expert layout."""
    d = draft_model_spec(setup.model, spec)
    moe = d.moe is not None
    try:
        return Setup(d, setup.gpu, tp=setup.tp, pp=1, ep=setup.ep if moe else 1, weight_dtype=setup.weight_dtype,
                     kv_dtype=setup.kv_dtype, dp=setup.dp if moe else 1, expert_imbalance=setup.expert_imbalance)
    except InputError as e:  # the draft cannot take the target's layout (a draft model whose heads tp does not split)
        raise InputError(f"spec.{e.field}", f"the draft: {e.reason}") from None


def draft_group(setup: Setup, spec: Speculation, b, context) -> Group:
    """The draft's work in one speculative step: ``tokens`` single-token steps of the draft network at
    batch ``b`` (its fixed per-step overhead is not charged again: the drafts run inside the step)."""
    ds = draft_setup(setup, spec)
    groups = step_groups(ds, S=1, P=np.maximum(np.asarray(context, dtype=float) - 1, 0), b=b, phase="decode")
    k = spec.tokens * (np.asarray(b, dtype=float) > 0)  # a step without decodes drafts nothing
    t = sum(g.time_s for g in groups) * k
    fl = sum(g.flops for g in groups) * k
    by = sum(g.bytes for g in groups) * k
    zero = np.zeros_like(np.asarray(t, dtype=float))
    compute = sum(g.compute_s for g in groups) * k + zero
    memory = sum(g.memory_s for g in groups) * k + zero
    latency = sum(g.latency_s for g in groups) * k + zero
    return Group("draft", np.asarray(fl, dtype=float) + zero, np.asarray(by, dtype=float) + zero,
                 np.asarray(t, dtype=float), "spec_tpot", compute, memory, latency)


def speculative_groups(setup: Setup, spec: Speculation, b, context, chunk=None) -> list[Group]:
    """Operator groups of one speculative step: the target verifying ``tokens`` + 1 tokens per sequence
    (with an optional prompt chunk, as ``step_groups``) and the draft's proposals."""
    c = np.asarray(context, dtype=float)
    verify = step_groups(setup, S=spec.tokens + 1, P=np.maximum(c - 1, 0), b=b, phase="decode", chunk=chunk)
    return [*verify, draft_group(setup, spec, b, c)]
