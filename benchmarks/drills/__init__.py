"""Failure drills on the local stack (issue 7): see ``python -m benchmarks.drills --help``."""
