"""The shared layers below the parts: nets and the feature contract, planning math, the HPA,
lineage, deployment, the web stack and observability."""
