"""The reference ML system built to scale: data, training, serving, generation, retrieval,
online learning and compression."""
