"""Benchmarks: kernel timings of GDN tree verification and state recovery (``repro bench kernels``)."""
