"""The draft worker (docs/design.md, "The worker"; FORMAT.md): per-session windows of rows, a drafter,
and the server around them."""

from .drafters import DRAFTER_NAMES, Drafter, DraftItem, IntegrityDrafter, make_drafter
from .faults import FaultAction, FaultPlan
from .server import CRASH_EXIT_CODE, WorkerServer, is_loopback
from .session import Session, SessionTable, SlotWindow

__all__ = ["WorkerServer", "FaultPlan", "FaultAction", "Drafter", "DraftItem", "IntegrityDrafter",
           "make_drafter", "DRAFTER_NAMES", "Session", "SessionTable", "SlotWindow", "is_loopback",
           "CRASH_EXIT_CODE"]
