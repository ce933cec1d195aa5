"""Conditions and human-readable explanations. Pure."""
