"""Running jobs: the executor and its parts.

- `executor`: `Runtime`, the one class callers use, made of the parts below;
- `dispatch`: claims jobs into slots and starts their runs;
- `job_runner`: runs a job, maps what it raised to an outcome, parks one that waits for an answer;
- `cancellation`: honours cancels and interrupts, never mid-step;
- `drain`: drains on shutdown;
- `run_life`, `state`: where a run stands, and the state the parts share;
- `job_writes`: what a running job writes to the store, handed to its `JobContext`;
- `slots`: this node's worker slots, the one place that counts them;
- `leases`: the heartbeat that keeps this node's leases alive and hears cancels;
- `sweeper`: recovery and deadlines, safe to run on every node at once;
- `outcomes`: how a run's end is written down.
"""

from handles.outcomes import result_to_json
from handles.runtime.executor import Runtime
from handles.runtime.sweeper import SWEEP_BATCH

__all__ = ["SWEEP_BATCH", "Runtime", "result_to_json"]
