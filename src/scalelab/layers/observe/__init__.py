"""Observability for operators: the Grafana dashboard and the Prometheus recording and alerting
rules (multi-window, multi-burn-rate error budgets) for the metrics scalelab's servers export."""
