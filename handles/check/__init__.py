"""`handles check`: prove a live MCP server's long-running tools against named gates over the public wire
(see docs/checking.md)."""

from handles.check.command import add_check_command, run_gates
from handles.check.gates import GATES
from handles.check.plan import CheckPlan, JobPlan, load_plan
from handles.check.report import GateResult

__all__ = ["GATES", "CheckPlan", "GateResult", "JobPlan", "add_check_command", "load_plan", "run_gates"]
