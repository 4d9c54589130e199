"""The worker's drafters (docs/design.md, "The worker"): one module per drafter, what they share in
`base`, and the table that picks one by name in `registry`. This face re-exports the shared types, the
`integrity` drafter and the table; the `torch` (`torch_head.TorchDrafter`) and `dspark`
(`dspark.DSparkDrafter`) drafters are imported from their own modules, only when chosen, so importing
this package never loads torch. Drafter modules import `base` (and each other's modules), never this face.
"""

from .base import Drafter, DraftItem, drafter_slot_bytes
from .integrity import IntegrityDrafter
from .registry import DRAFTER_NAMES, DRAFTERS, DrafterEntry, make_drafter

__all__ = ["DraftItem", "Drafter", "IntegrityDrafter", "make_drafter", "DRAFTER_NAMES", "DRAFTERS", "DrafterEntry",
           "drafter_slot_bytes"]
