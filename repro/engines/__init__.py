"""Other implementations' decode loops run on the same checkpoint and prompts as repro's routes.

One module per implementation, each a function ``(target_dir, drafter_dir, prompt_ids,
max_new_tokens, temperature, seed, ...) -> EngineResult``; ``catalog`` names them and ``verdicts``
checks each against repro's plain AR tokens (lossless / diverged at token k / refused).
"""
