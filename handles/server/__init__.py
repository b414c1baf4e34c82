"""The faces a server shows: every part that speaks MCP on the server side.

- `bind_mcpserver`, `bind_fastmcp`: binding the jobs' tools to the SDK's `MCPServer` or FastMCP 4.
- `handle_tools`: the generator of the handle tools (`<job>_start`, `_progress`, `_fetch`, ...)
  (their names: `handles.tool_layout`), built of `tool_shapes` (what a tool is and answers),
  `follow_tools` (the follow tools' definitions), `next_steps` (each reply's `next`) and
  `quiet_node` (a reply about a job whose node has gone quiet); `plain_tool`: a job as one ordinary tool, and
  `first_round`: what it does about a question asked before the job.
- `tasks_extension`: the Tasks extension (`tasks/get`, `tasks/update`, `tasks/cancel`, pushed status).
- `argument_gate`, `envelope`, `result_links`: checks and answers middleware gives before the SDK.
- `serving`, `http_server`, `health`, `startup`: running a node (stdio, Streamable HTTP, drain, probes).
"""
