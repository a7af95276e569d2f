"""The llama.cpp runtime both the compiler (KV blocks, derived requests) and the engine (generation) drive: the
low-level context with its KV splice (splice.py) and the chat-prompt layout (prompt.py)."""
