"""The kubelet's Dynamic Resource Allocation plugin API (DRAPlugin service, v1 and v1beta1)."""
