"""The round: what the proxy does for engine step t, from `gathered >= t` to `published = t`
(docs/design.md, "The round").

`core.RoundCore` keeps the nine steps in order, each in its own module: `ring_model` (the engine's ring,
mirrored), `breaker` (the circuit breaker), `resync_plan` (which windows to resend), `pacing` (the row
cap of a STEP), `ring_rows` (gathering rows), `reply_page` (packing the page the engine reads),
`acceptance` and `gate_tps` (the acceptance gate, from acceptance and from tokens/s), `ndrafts` (drafts
per request), `late` (rounds the watchdog already failed), `fused` (the usual round in two C calls) and
`stats` (its latencies). `_fastround*.c` are the native hot paths (the engine shim's and the wire's
too); `dspark_proxy/native.py` chooses them or their Python reference models.

Nothing here opens a socket or reads the command line: the link to the worker (`dspark_proxy/link/`)
comes in as a `DraftClient`, and `dspark_proxy/proxy.py` drives the rounds.
"""
