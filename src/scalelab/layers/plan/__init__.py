"""Planning calculators: the Chinchilla law and its compute-optimal plan; memory per rank.

Pure functions of numbers, used by the `plan`/`fit` commands, the trainer and the report; they
import no part.
"""
