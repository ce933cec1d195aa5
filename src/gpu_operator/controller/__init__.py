"""Wiring: caches -> planners -> executor; health and metrics endpoints."""
