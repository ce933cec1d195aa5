"""One module per operand state: render(policy, facts) -> objects, and readiness. Pure."""
