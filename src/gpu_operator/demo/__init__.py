"""Glue that runs the product on the simulated cluster with mock GPUs."""
