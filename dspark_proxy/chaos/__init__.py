"""The fault campaign (docs/guarantees.md): the simulated engine through the real
shim, a real worker and a real proxy as child processes, every fault kind injected on a schedule, and a
report of what the engine saw.

    from dspark_proxy.chaos import ChaosConfig, run_campaign, format_table
    report = run_campaign(ChaosConfig(duration_s=60, deadline_ms=30, margin_ms=20))
    print(format_table(report)); assert report["ok"], report["failures"]

`dspark-proxy chaos` is the command over the same function.

Layering: a module imports only modules on lines below its own (imports inside functions and under
TYPE_CHECKING too), so the package has no import circle:
    campaign                      runs everything: ChaosConfig, run_campaign
    schedule, report, plot        schedule: kinds; report: completeness and the pool/ring bars; plot: controller
    kinds                         the table: the fault kinds, controller
    injectors, pool_faults, ring_faults, rogue    the fault kinds: controller (rogue: flood); never the table
    controller                    Controller, Injection, Settings (what a fault kind works with)
    corrupt, probe, system, tally, flood, completeness    no chaos module
"""

from .campaign import ChaosConfig, run_campaign
from .controller import Injection
from .corrupt import CORRUPTION_MODES, DescriptorCorruptor, corrupt_round
from .report import build_report, format_table
from .schedule import FAULT_KINDS, KIND_NAMES, FaultKind

__all__ = ["ChaosConfig", "Injection", "run_campaign", "build_report", "format_table", "FAULT_KINDS",
           "KIND_NAMES", "FaultKind", "CORRUPTION_MODES", "corrupt_round", "DescriptorCorruptor"]
