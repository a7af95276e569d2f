"""Code shared by every Nexus service: config, errors, store, server bootstrap, clients."""
