"""The kubelet's streaming side: container logs, exec/attach, port-forward, proxy, debug containers.

`runtime` keeps what a container runtime would (per-instance logs, stdin, exec handlers, served
ports); the other modules answer the API's pod subresources from it over HTTP, WebSockets and SPDY.
"""
