"""Load testing: open/closed-loop generator, capacity search, error budgets, HPA simulation."""
