"""The operator console: see and steer every job from a browser (see docs/console.md)."""

from handles.console.app import console_app

__all__ = ["console_app"]
