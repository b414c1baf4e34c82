"""The operator console: see and steer every job from a browser (see docs/console.md).

Mount it beside `/mcp` in a server, or serve it alone with `handles console`.
"""

from handles.console.app import console_app

__all__ = ["console_app"]
