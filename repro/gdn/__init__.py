"""Gated DeltaNet math: the pure-torch reference (the oracle) and, on GPU, kernels."""
