"""Training the Llama transformer beyond data parallelism: FSDP2, tensor and pipeline parallel.

`config` says what one run is; `dims` which parallelisms are on and the device mesh; `apply`
applies them in a fixed order (TP, then FSDP or DDP); `pipeline` splits the model into stages
and runs a schedule; `measure` counts bytes and times collectives; `loop` trains; `worker` is the
process torchrun starts; `launch` starts it; `bench` sweeps strategies; `multinode` rehearses
losing a node.
"""
