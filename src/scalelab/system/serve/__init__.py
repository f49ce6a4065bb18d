"""The model server: Open Inference Protocol v2 over HTTP with dynamic batching, bounded queues,
deadlines, versions, canary/shadow, a response cache and Prometheus metrics.

`app.create_app(settings)` builds the ASGI app; `server.serve(settings)` runs it under uvicorn.
"""
