"""The fault campaign (docs/guarantees.md): the simulated engine through the real
shim, a real worker and a real proxy as child processes, every fault kind injected on a schedule, and a
report of what the engine saw.

    from dspark_proxy.chaos import ChaosConfig, run_campaign, format_table
    report = run_campaign(ChaosConfig(duration_s=60, deadline_ms=30, margin_ms=20))
    print(format_table(report)); assert report["ok"], report["failures"]

`dspark-proxy chaos` is the command over the same function.
"""

from .campaign import ChaosConfig, Injection, run_campaign
from .corrupt import CORRUPTION_MODES, DescriptorCorruptor, corrupt_round
from .report import build_report, format_table
from .schedule import FAULT_KINDS, KIND_NAMES, FaultKind

__all__ = ["ChaosConfig", "Injection", "run_campaign", "build_report", "format_table", "FAULT_KINDS",
           "KIND_NAMES", "FaultKind", "CORRUPTION_MODES", "corrupt_round", "DescriptorCorruptor"]
