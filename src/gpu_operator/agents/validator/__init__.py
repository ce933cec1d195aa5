"""The operator validator (`nvidia-validator` in upstream's `nvidia-operator-validator` pods and
the operands' `driver-validation` init containers), as `gpu-operator agent validator`.

One run validates one component (driver, toolkit, cuda, plugin, nvidia-fs, gdrcopy,
nvidia-peermem, mofed): it removes the component's marker under `/run/nvidia/validations`, checks,
and writes the marker again on success. Every wait is bounded; a failure names the first failing
link with its evidence, as the last log line and as the container's termination message.

Modules: `components` (pure: markers, driver info, GPU resources), `workload` (pure: the workload
pods and how to read one's status), `protocols` (the I/O the runner needs), `runner` (the checks),
`host` (the real I/O on a node), `command` and `cli` (the command line).
"""
