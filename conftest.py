"""The examples of README.md and docs/ run as tests: one item per page
(tests/support/doc_examples.py). ``python -m pytest README.md docs`` runs only them."""

pytest_plugins = ["tests.support.doc_examples"]
