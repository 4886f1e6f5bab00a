"""KV-cache bytes against hand-computed values."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import calculator as pc


def test_llama_3_1_70b_bf16_per_token():
    # 2 (K,V) * 8 kv heads * 128 head_dim * 80 layers * 2 bytes
    assert pc.kv_bytes_per_token(pc.load_model("llama-3.1-70b"), "bf16") == 2 * 8 * 128 * 80 * 2 == 327_680
    assert pc.kv_cache_bytes(pc.load_model("llama-3.1-70b"), tokens=4096, kv_dtype="bf16") == 327_680 * 4096


def test_deepseek_v3_mla_latent_per_token():
    # (kv_lora_rank 512 + rope 64) * 61 layers * 2 bytes
    assert pc.kv_bytes_per_token(pc.load_model("deepseek-v3"), "bf16") == 576 * 61 * 2 == 70_272


def test_fp8_and_int4_kv_scale_bytes():
    m = pc.load_model("llama-3.1-8b")
    assert pc.kv_cache_bytes(m, 1000, "fp8") == pc.kv_cache_bytes(m, 1000, "bf16") / 2
    assert pc.kv_cache_bytes(m, 1000, "int4") == pc.kv_cache_bytes(m, 1000, "bf16") / 4


def test_gpt_oss_sliding_layers_cap_at_window():
    m = pc.load_model("gpt-oss-120b")
    per_layer_token = 2 * 8 * 64 * 2  # 2048 bytes
    # 18 full layers keep all 1000 tokens, 18 sliding layers keep 128
    assert pc.kv_cache_bytes(m, 1000, "bf16") == 18 * per_layer_token * 1000 + 18 * per_layer_token * 128


def test_gemma_3_pattern_and_mistral_window():
    g3 = pc.load_model("gemma-3-27b")
    assert (g3.num_sliding_layers, g3.sliding_window) == (52, 1024)
    per = 2 * 16 * 128 * 2
    assert pc.kv_cache_bytes(g3, 8192) == 10 * per * 8192 + 52 * per * 1024
    mistral = pc.load_model("mistral-7b")
    assert pc.kv_cache_bytes(mistral, 10_000) == pc.kv_cache_bytes(mistral, 4096)


def test_tp_beyond_kv_heads_replicates_heads():
    m = pc.load_model("llama-3.1-70b")  # 8 KV heads
    one = pc.kv_cache_bytes(m, 100, tp=8)
    assert one == pc.kv_cache_bytes(m, 100, tp=1)  # one head per GPU: no duplication
    assert pc.kv_cache_bytes(m, 100, tp=16) == 2 * one  # each head on two GPUs
    ds = pc.load_model("deepseek-v3")  # the MLA latent is replicated on every GPU
    assert pc.kv_cache_bytes(ds, 100, tp=8) == 8 * pc.kv_cache_bytes(ds, 100, tp=1)


def test_negative_tokens_rejected():
    with pytest.raises(ValueError, match="tokens"):
        pc.kv_cache_bytes(pc.load_model("llama-3.1-8b"), -1)


@given(st.integers(0, 200_000), st.integers(0, 200_000))
def test_kv_is_monotone_and_vectorised(a, b):
    m = pc.load_model("gpt-oss-20b")
    lo, hi = sorted((a, b))
    assert pc.kv_cache_bytes(m, lo) <= pc.kv_cache_bytes(m, hi)
    arr = pc.kv_cache_bytes(m, np.array([lo, hi]))
    assert list(arr) == [pc.kv_cache_bytes(m, lo), pc.kv_cache_bytes(m, hi)]
