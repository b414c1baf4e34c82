"""Running jobs: the executor and its parts.

- `executor`: claims jobs into slots, runs them, parks those that wait for an answer,
  honours cancels, and drains on shutdown;
- `slots`: this node's worker slots, the one place that counts them;
- `leases`: the heartbeat that keeps this node's leases alive and hears cancels;
- `sweeper`: recovery and deadlines, safe to run on every node at once;
- `outcomes`: how a run's end is written down.
"""

from handles.outcomes import result_to_json
from handles.runtime.executor import Runtime
from handles.runtime.sweeper import SWEEP_BATCH

__all__ = ["SWEEP_BATCH", "Runtime", "result_to_json"]
