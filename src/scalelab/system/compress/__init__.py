"""The compression and routing bench: quantization, pruning, distillation, cascade and cache,
each measured per class, for latency, size, memory and cost, on the device at hand.

Reads a flights model version (model.json + model.safetensors + preprocess.json) and a dataset
directory (train.parquet, test.parquet); writes records, a Pareto plot and, on request, each
variant as a new version in the serving repository. Imports only scalelab.lab.core and
scalelab.layers.nets.
"""
