"""Load testing: open/closed-loop generator, capacity search, error budgets (the HPA
simulation is `lab/autoscale`)."""
