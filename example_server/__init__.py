"""An example MCP server built with `handles`: three long jobs and one quick tool."""

from example_server.server import build_server, create_jobs, job_seconds

__all__ = ["build_server", "create_jobs", "job_seconds"]
