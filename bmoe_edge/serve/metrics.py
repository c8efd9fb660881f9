"""/metrics in Prometheus' text format (version 0.0.4): counters and gauges of the one engine."""

from __future__ import annotations

from bmoe_edge.serve.slots import BatchStats
from bmoe_edge.serve.stats import Stats


def prometheus(stats: Stats, queue_depth: int, rejected: int, batch: BatchStats | None = None) -> str:
    """`batch`: None leaves out the batch rows (with several API keys: their token counts are every tenant's)."""
    hit = stats.cache_hits / stats.cache_lookups if stats.cache_lookups else 0.0
    rows = [
        ("bmoe_requests_total", "counter", "Requests answered to the end.", stats.requests),
        ("bmoe_request_failures_total", "counter", "Requests the engine failed.", stats.failures),
        ("bmoe_requests_cancelled_total", "counter", "Requests whose client went away.", stats.cancelled),
        ("bmoe_requests_rejected_total", "counter", "Requests refused with 429: the queue was full.", rejected),
        ("bmoe_prompt_tokens_total", "counter", "Prompt tokens of all requests.", stats.prompt_tokens),
        ("bmoe_prompt_tokens_reused_total", "counter", "Prompt tokens the context already held.",
         stats.reused_tokens),
        ("bmoe_completion_tokens_total", "counter", "Generated tokens.", stats.completion_tokens),
        ("bmoe_decode_seconds_total", "counter", "Time spent generating after the prompt.", stats.decode_seconds),
        ("bmoe_tokens_per_second", "gauge", "Decode speed of the last request.", stats.last_tok_s),
        ("bmoe_prompt_seconds_total", "counter", "Time spent decoding prompts (what the context did not hold).",
         stats.prompt_seconds),
        ("bmoe_prompt_tokens_per_second", "gauge", "Prompt decode speed of the last request.",
         stats.last_prompt_tok_s),
        ("bmoe_prefill_bytes_read_total", "counter", "Bytes read from storage while decoding prompts.",
         stats.prefill_bytes),
        ("bmoe_time_to_first_token_seconds", "gauge", "The last request's time from the engine taking it to its "
         "first token.", stats.last_ttft_seconds),
        ("bmoe_expert_cache_hit_ratio", "gauge", "Expert cache hits / lookups since start.", hit),
        ("bmoe_expert_bytes_read_total", "counter", "Bytes read from storage for experts.", stats.bytes_read),
        ("bmoe_read_stall_seconds_total", "counter", "Compute time spent waiting for reads.", stats.stall_ms / 1000),
        ("bmoe_draft_tokens_total", "counter", "Speculative decoding (--speculative): draft tokens verified.",
         stats.drafted),
        ("bmoe_draft_tokens_accepted_total", "counter", "... and those the model accepted (tokens it did not "
         "decode one at a time).", stats.accepted),
        ("bmoe_resident_memory_bytes", "gauge", "Resident set size after the last token.", stats.rss_bytes),
        ("bmoe_queue_depth", "gauge", "Requests waiting for the engine.", queue_depth),
        ("bmoe_busy", "gauge", "1 while the engine generates.", int(stats.busy)),
        ("bmoe_expert_pool_to_warm_bytes", "gauge", "Memory the expert cache may fill that the idle engine has yet "
         "to fault in (0: the next prompt's reads land in pages that exist).", stats.pool_to_warm_bytes),
    ]
    rows += [] if batch is None else [
        ("bmoe_slots", "gauge", "Requests the engine decodes together (--parallel).", batch.slots),
        ("bmoe_slots_busy", "gauge", "Slots generating now.", batch.slots_busy),
        ("bmoe_batch_steps_total", "counter", "Batched decodes (--parallel > 1).", batch.steps),
        ("bmoe_batch_tokens_total", "counter", "Tokens of all batched decodes (per step: / steps).",
         batch.batch_tokens),
        ("bmoe_batch_sequences", "gauge", "Sequences in the last batched decode.", batch.last_batch_sequences),
        ("bmoe_batch_sequences_max", "gauge", "The most sequences in one batched decode.", batch.max_batch_sequences),
        ("bmoe_batch_union_expert_bytes_total", "counter", "Decode-only batches: bytes of the distinct experts "
         "they routed to (each read at most once for all sequences).", batch.union_bytes),
        ("bmoe_batch_summed_expert_bytes_total", "counter", "... and what their sequences route to each alone.",
         batch.summed_bytes),
        ("bmoe_batch_bytes_read_total", "counter", "Bytes read by the batched decodes, each step once "
         "(bmoe_expert_bytes_read_total adds a shared step's reads to each request it gave a token).",
         batch.bytes_read),
        ("bmoe_batch_decode_bytes_read_total", "counter", "... by the decode-only ones (no prompt chunk).",
         batch.decode_bytes_read),
        ("bmoe_inter_token_gap_seconds_max", "gauge", "The longest wait of any stream between two of its tokens "
         "since start (a long prompt beside it takes a chunk a step).", batch.worst_gap_seconds),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {value:g}"]
    return "\n".join(lines) + "\n"
