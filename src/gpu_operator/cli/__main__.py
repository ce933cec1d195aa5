"""`python -m gpu_operator.cli`: the same as the `gpu-operator` console script."""

from gpu_operator.cli.main import main

main()
