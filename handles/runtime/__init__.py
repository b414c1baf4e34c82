"""Running jobs: `Runtime` (handles.runtime.executor) and the parts it is made of."""

from handles.runtime.executor import Runtime
from handles.runtime.sweeper import SWEEP_BATCH

__all__ = ["SWEEP_BATCH", "Runtime"]
