"""Target models: one hybrid GDN + attention language model, loadable from native formats."""
