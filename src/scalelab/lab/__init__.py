"""The lab: the method (core), the load testers, the diagnosis and the report — what measures
a system, ours or the user's."""
