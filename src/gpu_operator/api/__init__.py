"""CRD models, defaults, semantic validation, CRD schema generation and well-known keys. Pure."""
