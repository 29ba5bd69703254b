"""Training recipes: a tiny target from the corpus, and drafters by self-distillation from it."""
