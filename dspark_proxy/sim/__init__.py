"""The simulated engine: realistic batches driven through any shim, every usable draft checked
against the `integrity` oracle.

Used by the tests, ``dspark-proxy demo``, chaos runs and benchmarks::

    from dspark_proxy.sim import SimConfig, SimEngine
    result = SimEngine(SimConfig(seed=1, max_reqs=64)).run(shim, rounds=5000)
    assert result.wrong_drafts == 0

`OracleShim` answers in-process as a correct system would (or corrupts on purpose), for testing the
engine without a proxy.
"""

from .config import SimConfig
from .engine import Batch, SimEngine, SimResult
from .loopback import CORRUPTIONS, OracleReply, OracleShim
from .oracle import CheckResult, Oracle
from .rows import RowGen

__all__ = ["SimConfig", "SimEngine", "SimResult", "Batch", "OracleShim", "OracleReply", "CORRUPTIONS",
           "Oracle", "CheckResult", "RowGen"]
