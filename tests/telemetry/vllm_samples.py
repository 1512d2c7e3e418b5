"""vLLM's /metrics in its real text format (metric names and labels as vLLM's metrics design doc
lists them: `vllm:request_success_total` by `finished_reason`, `vllm:e2e_request_latency_seconds` a
histogram, every series labelled with `engine` and `model_name`), at a given request count."""

from __future__ import annotations

MODEL = "unsloth/Llama-3.2-1B-Instruct"


def vllm_metrics(stop: int, length: int, latency_sum: float, latency_count: int) -> str:
    """The exposition after `stop` + `length` finished requests whose latencies add up to
    `latency_sum` seconds over `latency_count` requests (the histogram's buckets are filler)."""
    labels = f'engine="0",model_name="{MODEL}"'
    return f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{labels}}} 3.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{labels},finished_reason="stop"}} {float(stop)}
vllm:request_success_total{{{labels},finished_reason="length"}} {float(length)}
vllm:request_success_total{{{labels},finished_reason="abort"}} 0.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{{{labels}}} {latency_sum}
vllm:e2e_request_latency_seconds_bucket{{{labels},le="0.3"}} 0.0
vllm:e2e_request_latency_seconds_bucket{{{labels},le="0.5"}} {float(latency_count // 2)}
vllm:e2e_request_latency_seconds_bucket{{{labels},le="1.0"}} {float(latency_count)}
vllm:e2e_request_latency_seconds_bucket{{{labels},le="+Inf"}} {float(latency_count)}
vllm:e2e_request_latency_seconds_count{{{labels}}} {float(latency_count)}
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{{labels}}} 91234.0
"""
