"""The MIG manager agent (`gpu-operator agent mig-manager`): applies the mig-parted layout that a
node's `nvidia.com/mig.config` label names, with upstream's node protocol.

Decisions are pure (`profiles`, `config`, `layout`, `planner`, `protocol`, `generate`); NVML and
host effects live in `gpus` and `host`; `reconfigure` and `runner` drive one node over the API.
"""
