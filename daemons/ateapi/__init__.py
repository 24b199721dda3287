"""The ateapi daemon: the control plane's gRPC server."""
