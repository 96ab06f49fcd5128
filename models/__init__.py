"""Probabilistic encoders, Gaussian math, datasets, training and evaluation."""
