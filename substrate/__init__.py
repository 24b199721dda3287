"""substrate: a control plane that multiplexes many stateful, sandboxed actors onto few workers."""

from substrate._version import __version__

__all__ = ["__version__"]
