"""The router daemon: the HTTP ingress that resolves actors and forwards to their workers."""
