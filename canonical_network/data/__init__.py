"""Datasets and LightningDataModules: rotated MNIST, CIFAR-10 and STL-10 (torchvision), N-body, point clouds."""
