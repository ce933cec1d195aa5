"""`python -m gpu_operator` runs the `gpu-operator` command."""

from gpu_operator.cli import main

main()
