"""Device-plugin API v1beta1: generated messages (`api_pb2`) and services (`api_pb2_grpc`)."""
