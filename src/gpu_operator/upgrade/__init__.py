"""Driver upgrade state machine planner. Pure."""
