"""Ingest tools into a Nexus registry from outside sources (MCP servers)."""
