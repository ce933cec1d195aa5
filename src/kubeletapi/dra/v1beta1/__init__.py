"""The kubelet's DRA plugin API, version v1beta1 (generated modules: api_pb2, api_pb2_grpc)."""
