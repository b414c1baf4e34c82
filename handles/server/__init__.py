"""The faces a server shows: every part that speaks MCP on the server side."""
