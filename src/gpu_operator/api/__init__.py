"""CRD models, defaults, semantic validation, CRD schema generation and well-known keys. Pure."""

from gpu_operator.api.clusterpolicy import ClusterPolicy, ClusterPolicySpec, ClusterPolicyStatus
from gpu_operator.api.nvidiadriver import NVIDIADriver, NVIDIADriverSpec, NVIDIADriverStatus
from gpu_operator.api.validation import Checked, Problem, check_document

__all__ = [
    "Checked",
    "ClusterPolicy",
    "ClusterPolicySpec",
    "ClusterPolicyStatus",
    "NVIDIADriver",
    "NVIDIADriverSpec",
    "NVIDIADriverStatus",
    "Problem",
    "check_document",
]
