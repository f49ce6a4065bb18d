"""The training part: a data-parallel PyTorch trainer for the flights delay-class model.

torchrun launch (gloo on CPU, nccl on CUDA), large-batch LR policy, gradient accumulation,
sharded optimizer state (ZeRO, FSDP2), verified atomic checkpoints with rehearsed recovery, a
worker sweep written as records, and a compute-optimal scaling-law grid. Reads the data part's
files (or the raw flights CSV), writes models into the serving repository layout.
"""
