"""repro: a reference harness for speculative decoding on Gated DeltaNet language models."""

__version__ = "0.1.0"
