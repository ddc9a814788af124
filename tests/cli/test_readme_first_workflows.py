"""The README's first workflow is the smallest durable workflow: at most 12 lines under its
file name, one import line, an ``App`` on a SQLite file. That it runs and prints its result
is checked where every example of the README is run (tests/support/doc_examples.py)."""

from __future__ import annotations

import re

from tests.support import processes

README = processes.ROOT / "README.md"


def test_the_readmes_first_example_is_a_durable_workflow_in_12_lines() -> None:
    first = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    header, *lines = first.strip().splitlines()
    assert header == "# hello.py"  # the file the console block after it runs
    assert len(lines) <= 12
    assert [line for line in lines if "import" in line] == ["from runifold_sync import App"]
    assert 'App("sqlite:///hello.db")' in first  # durable: the store is a file
    assert lines[-1].startswith("print(")
