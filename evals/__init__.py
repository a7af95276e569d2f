"""Offline evaluations of Nexus components (routing quality, ...), each writing a JSON report + plot."""
