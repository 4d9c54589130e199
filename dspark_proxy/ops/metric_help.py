"""What each Prometheus metric means, in the words of its HELP line (metrics.py, worker/metrics.py).

A HELP line that only repeats the key ("counter accept_batch_paused") tells an operator nothing; these
say what was counted or measured. A key missing here still gets a HELP line naming its key and the page
that lists every metric (docs/operating.md), so a new counter never breaks the endpoint.
"""

from __future__ import annotations

__all__ = ["COUNTER_HELP", "GAUGE_HELP", "LATENCY_HELP", "counter_help", "gauge_help", "latency_help"]

COUNTER_HELP = {
    "rounds_ok": "Rounds whose drafts reached the engine in time.",
    "rounds_published_first": "Rounds the acceptance gate asked no drafts of, published before their STEP.",
    "rounds_answered_by_engine": "Paused rounds the engine answered itself (no drafts) before the proxy published.",
    "paused_rows_overtaken": "Paused rounds whose rows the engine rewrote before the proxy read them (windows resent).",
    "rounds_failed": "Rounds the engine ran target-only (no drafts in time, or the breaker open).",
    "rounds_some_failed": "Rounds where part of a pool's workers did not answer in time.",
    "rounds_decode": "Rounds that were decode steps.",
    "rounds_prefill": "Rounds that carried prefill rows.",
    "rounds_n_out_cut": "Rounds whose drafts per request were cut by the n_out table.",
    "rows_sent": "Hidden-state rows sent to the workers.",
    "attaches": "Engine attaches to the proxy's segment.",
    "deaths": "Engine processes seen dead while attached.",
    "engine_gone": "Rounds abandoned because the engine went away.",
    "abandoned": "Rounds abandoned before they were published.",
    "breaker_trips": "Times the circuit breaker opened.",
    "breaker_recoveries": "Times the circuit breaker closed again after a good probe.",
    "spec_decode_num_drafts": "Draft sequences the engine verified (like vLLM's spec_decode counter).",
    "spec_decode_num_draft_tokens": "Draft tokens the engine verified.",
    "spec_decode_num_accepted_tokens": "Draft tokens the engine accepted.",
    "spec_decode_num_accepted_tokens_per_pos": "Draft tokens accepted, by position in the draft.",
    "accept_paused": "Requests paused from drafting for low acceptance.",
    "accept_resumed": "Paused requests that resumed drafting after a probe.",
    "accept_probes": "Probes of paused requests.",
    "accept_batch_paused": "Times the whole batch was paused from drafting for low acceptance.",
    "accept_batch_resumed": "Times the whole batch resumed drafting after a probe.",
    "accept_batch_probes": "Probes of a paused batch.",
    "accept_batch_probe_failed": "Probes of a paused batch that paused it again.",
    "accept_drafts_not_asked": "Requests not asked for drafts because they were paused.",
    "accept_batch_tps_samples": "Short pauses of the whole batch that measured its speed without drafts.",
    "accept_batch_tps_paused": "Times the whole batch was paused because drafting made it slower (tokens/s).",
    "accept_batch_tps_resumed": "Times a batch paused for speed resumed drafting after a probe beat the rate without.",
    "accept_batch_tps_probe_failed": "Probes of a batch paused for speed that paused it again.",
    "accept_batch_tps_recalled": "Times the batch grew or shrank to a size where drafting was found too slow, and paused again at once.",
    "fallbacks": "Rounds the engine ran target-only, by cause.",
    "request_status": "Requests in replies, by their status.",
    "requests_not_staged": "Requests left out of a round for lack of staging room.",
    "requests_over_link_cap": "Requests left out of a round over the worker link's cap.",
    "resync_rounds": "Rounds that carried window resyncs.",
    "resync_rows": "Rows sent to resync request windows.",
    "resync_bytes_staged": "Bytes staged for window resyncs.",
    "resync_windows_staged": "Request windows staged for a resync.",
    "resync_windows_deferred": "Resyncs deferred to a later round (the per-round cap).",
    "resync_windows_not_staged": "Resyncs not staged for lack of room.",
    "resync_requests_honoured": "Resync requests from the worker that were served.",
    "resync_pending": "Resyncs queued.",
    "ring_ranges_adopted": "Row ranges read from the engine's shared ring instead of staged.",
    "pool_slots_resent": "Request windows re-sent to a pool's new owner of their slot.",
    "stale_generation_new_sessions": "New worker sessions forced by a stale generation.",
    "watchdog_preempted": "Rounds the watchdog took over from a hung round loop.",
    "watchdog_skipped_rounds": "Rounds the watchdog failed to keep the engine going.",
    "watchdog_skipped_unknown_ring": "Watchdog rounds skipped because the ring was unknown.",
    "fault_round_hangs": "Injected round-loop hangs (fault injection).",
}

GAUGE_HELP = {
    "incarnations": "Times the proxy has (re)created its segment.",
    "resync_windows_per_round": "Most request windows resynced in one round.",
    "spin_max": "Longest a round's wait may spin before it sleeps, in seconds.",
    "breaker_state": "The circuit breaker's state (1 for the current one).",
    "breaker_trips": "Times the circuit breaker opened.",
    "breaker_consecutive_failures": "Failed rounds in a row (the breaker opens at its threshold).",
    "accept_gate_slots_paused": "Requests paused from drafting now.",
    "accept_gate_enabled": "1 while the acceptance gate may pause drafting (--accept-break-even > 0).",
    "accept_gate_break_even": "Accepted drafts per round below which drafting is paused (--accept-break-even).",
    "breaker_threshold": "Failed rounds in a row that open the breaker (--breaker-threshold).",
    "breaker_cooldown": "Rounds the open breaker keeps the network off (--breaker-cooldown).",
    "breaker_probes": "Probe rounds the open breaker has let through.",
    "breaker_recoveries": "Times the breaker closed again after a good probe.",
    "keep_awake_refused": "Keep-awake spinners that could not take SCHED_IDLE and so never spin.",
    "keep_awake_sleeping": "Keep-awake spinners asleep now (no round for --keep-awake-ms).",
    "keep_awake_spins": "Spin turns keep-awake's spinners have begun.",
    "accept_gate_slots_probing": "Paused requests being probed now.",
    "accept_gate_batch": "Whether the whole batch is drafting, paused or probing.",
    "accept_gate_tps_rule": "1 while the gate also pauses drafting that lowers tokens/s (--accept-tps-every > 0).",
    "accept_gate_tps_plain": "Tokens per request-second of engine time without drafts, as last measured.",
    "accept_gate_tps_drafting": "Tokens per request-second of engine time with drafts, as last measured.",
    "keep_awake_spinners": "Threads keeping the proxy's CPUs out of idle.",
    "watchdog_events_len": "Watchdog events kept for status.",
    "workers_len": "Workers the proxy knows.",
}

LATENCY_HELP = {
    "rtt": "Round trip to the worker(s), from the STEP sent to the reply read.",
    "rtt_decode": "Round trip to the worker(s) of decode rounds.",
    "rtt_prefill": "Round trip to the worker(s) of rounds with prefill rows.",
    "worker": "Time the worker spent on a STEP (its own measure, in the reply).",
    "gather": "Time from a round's publication to the proxy gathering it (idle gaps included).",
    "proxy_cost": "Time the proxy spent on a round besides the network.",
    "proxy_parked_decode": "Time a decode round's reply waited in the proxy for the engine.",
    "proxy_parked_prefill": "Time a prefill round's reply waited in the proxy for the engine.",
    "rank0_round": "Time of a whole round as rank 0 of the engine sees it.",
}


def _see(key: str) -> str:
    return f" (key {key}; docs/operating.md lists the metrics)"


def counter_help(key: str) -> str:
    return COUNTER_HELP.get(key) or f"The proxy's count of {key.replace('_', ' ')}" + _see(key) + "."


def gauge_help(name_key: str, key: str) -> str:
    words = key.replace("_", " ").replace(".", " ")
    return GAUGE_HELP.get(name_key) or f"The proxy's {words} now" + _see(key) + "."


def latency_help(base: str, key: str) -> str:
    return (LATENCY_HELP.get(base) or f"The proxy's {base.replace('_', ' ')}" + _see(key) + ".")
