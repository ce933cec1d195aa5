"""The demo: a thin session wiring the operator, kubesim and the simulated node host."""
