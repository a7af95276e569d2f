"""OpenAI-compatible HTTP front: /v1/chat/completions with tools, over the router and the engine."""
