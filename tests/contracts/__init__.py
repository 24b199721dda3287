"""Conformance tier: the shipped contract suites run against every adapter."""
