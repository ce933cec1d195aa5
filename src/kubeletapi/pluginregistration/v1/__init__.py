"""The kubelet's plugin-registration API, version v1 (generated modules: api_pb2, api_pb2_grpc)."""
