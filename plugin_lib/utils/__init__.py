"""Utilities with no knowledge of the method or the experiments."""
