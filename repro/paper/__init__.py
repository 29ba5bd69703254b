"""Paper artefacts: one module per table or figure (the experiment it runs, the function from records to
the table or figure, the ``baselines/`` key it is compared with), each a run-directory kind."""
