"""vLLM general plugin entry point (group `vllm.general_plugins`): attach on engine boot."""

from __future__ import annotations

__all__ = ["register"]


def register() -> None:
    """Called by vLLM in every engine process at start-up. Never raises, never blocks."""
    try:
        from .api import boot

        boot()
    except Exception:  # noqa: BLE001 - a plugin must never fail the engine's boot
        import logging

        logging.getLogger(__name__).exception("[shim] vLLM plugin: boot failed; target-only")
