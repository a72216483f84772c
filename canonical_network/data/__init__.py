"""Datasets and LightningDataModules: rotated MNIST, N-body, point clouds."""
