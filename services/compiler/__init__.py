"""Compiler service: MCP tool schema -> signature IR, GBNF grammar, embedding (and KV block), into the store."""
