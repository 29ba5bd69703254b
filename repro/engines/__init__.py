"""Other implementations' decode loops run on the same checkpoint and prompts as repro's routes.

One module per implementation, each a function ``(request: EngineRequest, **its own keywords) ->
EngineResult`` (both in ``result``); ``catalog`` names them and ``verdicts`` checks each against
repro's plain AR tokens (lossless / diverged at token k / refused).
"""
