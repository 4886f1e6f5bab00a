"""Write the benchmark-result fixtures of ``tests/fixtures/bench_results/`` (run from the repository root).

Each file is in the format its tool writes (field names and layout from vLLM's ``vllm bench serve
--save-result``, SGLang's ``bench_serving --output-file``, genai-perf's profile export and trtllm-bench's
``--report_json``), holding
synthetic runs: Llama-3.1-8B in bf16 on one H100 SXM, latencies predicted by pdplan's own serving
model at a known efficiency (``TRUE`` below), each multiplied by a fixed factor within ±4% so that
the fit has something to average. ``tests/test_calibrate.py`` checks that ``pdplan calibrate``
recovers ``TRUE`` from them and reproduces every run within its reported error.
"""

from __future__ import annotations

import json
from pathlib import Path

import calculator as pc
from calculator.serving import Deployment, Pool, PoolModel, Workload, evaluate
from calculator.serving.closed import closed_loop

OUT = Path("tests/fixtures/bench_results")
TRUE = {"compute": 0.70, "memory": 0.85, "step_overhead_us": 400.0}
NOISE = (1.03, 0.97, 1.02, 0.98, 1.04, 0.96, 1.01, 0.99)


def _gpu() -> pc.GPUSpec:
    g = pc.load_gpu("h100-sxm")
    return g.model_copy(update={"efficiency": g.efficiency.model_copy(update=TRUE)})


def predict(rate: float, isl: int, osl: int) -> tuple[float, float, float, float]:
    """(median TTFT, mean TTFT, median TPOT, mean TPOT) in ms of an open loop at ``rate`` requests/s."""
    g = _gpu()
    e = evaluate("llama-3.1-8b", Deployment(mode="mixed", pool=Pool(gpu=g.id)), Workload(rate=rate, isl=isl, osl=osl),
                 gpus=[g])
    assert e.stable, (rate, isl, osl)
    return e.ttft_s(50) * 1e3, e.ttft_mean_s * 1e3, e.tpot_s(50) * 1e3, e.tpot_mean_s * 1e3


def predict_closed(isl: int, osl: int, concurrency: int) -> tuple[float, tuple[float, float, float, float]]:
    """(throughput req/s, (median TTFT, mean TTFT, median TPOT, mean TPOT) in ms) of a closed loop of
    ``concurrency`` requests (fixed lengths: medians are the means)."""
    g = _gpu()
    pm = PoolModel.build(pc.load_model("llama-3.1-8b"), Pool(gpu=g.id), Workload(rate=1.0, isl=isl, osl=osl), g)
    c = closed_loop(pm, isl, osl, concurrency)
    return c.throughput_rps, (c.ttft_s * 1e3, c.ttft_s * 1e3, c.tpot_s * 1e3, c.tpot_s * 1e3)


def vllm_runs() -> list[dict]:
    runs = []
    for i, (rate, conc) in enumerate(((2.0, None), (6.0, None), (10.0, None), (None, 16))):
        isl, osl, n = 1024, 128, 200
        if conc:
            rate, times = predict_closed(isl, osl, conc)
        else:
            times = predict(rate, isl, osl)
        t50, tmean, p50, pmean = (x * NOISE[i] for x in times)
        runs.append({
            "date": f"20261130-10{i}000", "endpoint_type": "openai", "backend": "openai", "label": None,
            "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
            "num_prompts": n, "request_rate": "inf" if conc else rate, "burstiness": 1.0, "max_concurrency": conc,
            "duration": n / rate, "completed": n, "failed": 0, "total_input_tokens": n * isl,
            "total_output_tokens": n * osl, "request_throughput": rate, "request_goodput": None,
            "output_throughput": rate * osl, "total_token_throughput": rate * (isl + osl),
            "max_output_tokens_per_s": rate * osl * 1.4, "max_concurrent_requests": conc or 24,
            "mean_ttft_ms": tmean, "median_ttft_ms": t50, "std_ttft_ms": tmean * 0.4, "p99_ttft_ms": tmean * 3,
            "mean_tpot_ms": pmean, "median_tpot_ms": p50, "std_tpot_ms": pmean * 0.1, "p99_tpot_ms": pmean * 1.5,
            "mean_itl_ms": pmean, "median_itl_ms": p50 * 0.95, "std_itl_ms": pmean * 0.5, "p99_itl_ms": pmean * 4,
        })
    return runs


def sglang_runs() -> list[dict]:
    runs = []
    for i, rate in enumerate((1.0, 3.0, 5.0)):
        isl, osl, n = 2048, 256, 300
        t50, tmean, p50, pmean = (x * NOISE[i + 4] for x in predict(rate, isl, osl))
        runs.append({
            "tag": None, "backend": "sglang-oai", "dataset_name": "random", "request_rate": rate, "max_concurrency": None,
            "sharegpt_output_len": None, "random_input_len": isl, "random_output_len": osl, "random_range_ratio": 1.0,
            "server_info": None, "duration": n / rate, "completed": n, "total_input_tokens": n * isl,
            "total_input_text_tokens": n * isl, "total_input_vision_tokens": 0, "total_output_tokens": n * osl,
            "total_output_tokens_retokenized": n * osl, "request_throughput": rate, "input_throughput": rate * isl,
            "output_throughput": rate * osl, "total_throughput": rate * (isl + osl),
            "mean_e2e_latency_ms": tmean + (osl - 1) * pmean, "median_e2e_latency_ms": t50 + (osl - 1) * p50,
            "mean_ttft_ms": tmean, "median_ttft_ms": t50, "std_ttft_ms": tmean * 0.4, "p99_ttft_ms": tmean * 3,
            "mean_tpot_ms": pmean, "median_tpot_ms": p50, "std_tpot_ms": pmean * 0.1, "p99_tpot_ms": pmean * 1.5,
            "mean_itl_ms": pmean, "median_itl_ms": p50 * 0.95, "std_itl_ms": pmean * 0.5, "p95_itl_ms": pmean * 2,
            "p99_itl_ms": pmean * 4, "concurrency": rate * (tmean + (osl - 1) * pmean) / 1e3, "accept_length": None,
        })
    return runs


def genai_perf_run() -> dict:
    isl, osl, conc = 512, 256, 8
    rate, times = predict_closed(isl, osl, conc)
    t50, tmean, p50, pmean = (x * NOISE[7] for x in times)

    def stat(avg: float, p50_: float, unit: str) -> dict:
        return {"unit": unit, "avg": avg, "p50": p50_, "p90": avg * 1.3, "p99": avg * 2, "min": avg * 0.5,
                "max": avg * 2.5, "std": avg * 0.3}

    return {
        "request_throughput": {"unit": "requests/sec", "avg": rate},
        "request_latency": stat(tmean + (osl - 1) * pmean, t50 + (osl - 1) * p50, "ms"),
        "time_to_first_token": stat(tmean, t50, "ms"),
        "inter_token_latency": stat(pmean, p50, "ms"),
        "output_token_throughput": {"unit": "tokens/sec", "avg": rate * osl},
        "output_token_throughput_per_request": stat(1e3 / pmean, 1e3 / p50, "tokens/sec"),
        "output_sequence_length": stat(osl, osl, "tokens"),
        "input_sequence_length": stat(isl, isl, "tokens"),
        "input_config": {"model": ["meta-llama/Llama-3.1-8B-Instruct"], "endpoint_type": "chat", "streaming": True,
                         "concurrency": conc, "request_rate": None, "synthetic_input_tokens_mean": isl,
                         "output_tokens_mean": osl},
    }


def trtllm_bench_report() -> dict:
    """``trtllm-bench throughput --streaming --concurrency 4 --report_json``: the layout of TensorRT-LLM 1.x's
    ``ReportUtility.get_statistics_dict`` (``tensorrt_llm/bench/dataclasses/reporting.py``), one run."""
    isl, osl, conc, n = 2048, 128, 4, 64
    rate, times = predict_closed(isl, osl, conc)
    t50, tmean, p50, pmean = (x * NOISE[5] for x in times)
    latency = tmean + (osl - 1) * pmean

    def pct(avg: float, p50_: float) -> dict:
        return {"p50": p50_, "p90": avg * 1.05, "p95": avg * 1.07, "p99": avg * 1.1, "minimum": avg * 0.9,
                "maximum": avg * 1.12, "average": avg}

    return {
        "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "model_path": "None", "engine_dir": "None",
                   "version": "1.2.0", "backend": "Pytorch", "dtype": "bfloat16", "kv_cache_dtype": "None",
                   "quantization": "None"},
        "machine": {"name": "NVIDIA H100 80GB HBM3", "memory.total": 79.1, "clocks.mem": 2.619},
        "world_info": {"tp_size": 1, "pp_size": 1, "ep_size": 1, "world_size": 1, "max_batch_size": 256,
                       "max_num_tokens": 8192, "scheduling_policy": "GUARANTEED_NO_EVICT",
                       "kv_cache_percentage": 0.9, "issue_rate": 1e17},
        "request_info": {"num_requests": n, "avg_num_concurrent_requests": conc * 0.998,
                         "avg_input_length": float(isl), "avg_output_length": float(osl)},
        "performance": {"total_latency_ms": n / rate * 1e3, "avg_request_latency_ms": latency,
                        "request_throughput_req_s": rate, "system_output_throughput_tok_s": rate * osl,
                        "system_total_throughput_tok_s": rate * (isl + osl),
                        "output_throughput_per_user_tok_s": osl / latency * 1e3,
                        "output_throughput_per_gpu_tok_s": rate * osl,
                        "request_latency_percentiles_ms": pct(latency, latency)},
        "streaming_metrics": {"token_output_speed_tok_s": 1e3 / pmean, "avg_ttft_ms": tmean, "avg_tpot_ms": pmean,
                              "tpot_percentiles": pct(pmean, p50), "ttft_percentiles": pct(tmean, t50),
                              "gen_tps_percentiles": pct(1e3 / pmean, 1e3 / p50)},
        "dataset": {"isl_stats": pct(isl, isl), "osl_stats": pct(osl, osl), "max_isl": isl, "max_osl": osl,
                    "avg_isl": isl, "avg_osl": osl, "num_requests": n},
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "vllm_bench_serve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in vllm_runs()), encoding="utf-8")
    (OUT / "sglang_bench_serving.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sglang_runs()), encoding="utf-8")
    (OUT / "profile_export_genai_perf.json").write_text(json.dumps(genai_perf_run(), indent=2) + "\n", encoding="utf-8")
    (OUT / "trtllm_bench_report.json").write_text(json.dumps(trtllm_bench_report(), indent=4) + "\n", encoding="utf-8")
    print(f"wrote {OUT}/")


if __name__ == "__main__":
    main()
