"""Governance for every server: rate limits, budgets and kill switches, outside the app.

`limits` holds the pure policies (token buckets, budget windows), `config` the governance file,
`governor` the state of one process, `middleware` the ASGI layer with its admin routes and
metrics. Where it sits among the layers a request passes is written down in `web.hook`.
"""
