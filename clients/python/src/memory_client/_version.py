"""The package version (one place, read by the User-Agent and the MCP server)."""

__version__ = "0.1.0"
