"""``smdebug.core.reduction_config``: the same ReductionConfig as ``smdebug``."""

from smdebug.config import ReductionConfig
from smdebug.reductions import ALLOWED_NORMS, ALLOWED_REDUCTIONS

__all__ = ["ReductionConfig", "ALLOWED_REDUCTIONS", "ALLOWED_NORMS"]
