"""Drafters: propose candidate continuations for the target to verify."""
