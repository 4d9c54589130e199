"""The operator's surface: what a person or a monitoring system sees and runs (docs/operating.md).

`status` (the status segment and `dspark-proxy status`), `stats` and `events` (what the proxy
publishes there), `metrics` and `metric_help` (Prometheus), `screen` (the live view), `exitcodes` (the
one exit-code table), `runtime` (logging and the token file), `deps` (optional extras checked up
front), `logthrottle`, `launch` (starting a proxy or a worker as a child process) and `keep_awake`
(`--keep-awake-ms`, over `_keepawake.c`).
"""
