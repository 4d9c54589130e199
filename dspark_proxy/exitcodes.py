"""The CLI's exit codes, in one place, so that no module needs cli.py for them (which would be a cycle)."""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_STARTUP_FAILURE", "EXIT_WRONG_DRAFTS",
           "EXIT_MISSING_DEPENDENCY"]

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed (a chaos check, a missing segment)
EXIT_USAGE = 2  # click's own: a bad flag or value
EXIT_STARTUP_FAILURE = 3  # start / worker could not come up (segment, bind, drafter)
EXIT_WRONG_DRAFTS = 4  # a draft the engine would have used did not match the oracle
EXIT_MISSING_DEPENDENCY = 5  # an optional package the chosen settings need is not installed (deps.py)
