"""Layers shared by canonicalizers and predictors: Vector Neurons, kNN graphs, message passing helpers."""
