"""The Tasks extension's names that the server face and the client both use."""

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier, as a request declares it and a server advertises it."""

PROGRESS_META_KEY = "io.github.handles/progress"
"""`_meta` key of a `handles` server's `tasks/get` answer carrying numeric progress, `{"done": 3, "total": 4}`.

The extension carries progress in `statusMessage` only; other clients ignore this key."""
