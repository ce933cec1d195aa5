"""Kubernetes protobuf: the wire codec and the schemas of the built-in kinds."""
