"""Nexus services: router, compiler, engine, and the code they share (``services.common``)."""
