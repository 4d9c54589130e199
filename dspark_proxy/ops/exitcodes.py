"""The CLI's exit codes, in one place, so that no module needs cli.py for them (which would be a cycle).

docs/exit-codes.md is this table for users (monitoring scripts, systemd units): keep the two the same."""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_STARTUP_FAILURE", "EXIT_WRONG_DRAFTS",
           "EXIT_MISSING_DEPENDENCY", "EXIT_PROXY_DEAD", "EXIT_PROXY_HUNG", "EXIT_PROXY_REFUSED"]

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed (a chaos check; status/stop: no segment of that name)
EXIT_USAGE = 2  # click's own: a bad flag or value
EXIT_STARTUP_FAILURE = 3  # start / worker could not come up (segment, bind, drafter)
EXIT_WRONG_DRAFTS = 4  # a draft the engine would have used did not match the oracle
EXIT_MISSING_DEPENDENCY = 5  # an optional package the chosen settings need is not installed (deps.py)
# status / stop: the proxy's segment is there, but the proxy is not well (a script's health check)
EXIT_PROXY_DEAD = 6  # its owner is not running (killed): status; stop removes the segment, then exits 6
EXIT_PROXY_HUNG = 7  # status: alive, heartbeat stale; stop: still running after --timeout
EXIT_PROXY_REFUSED = 8  # status: alive, but every worker refused it (it drafts nothing); stop: not ours to signal
