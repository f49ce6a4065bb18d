"""Load testing over HTTP: the keep-alive and gRPC clients, the open/closed-loop driver, results."""
