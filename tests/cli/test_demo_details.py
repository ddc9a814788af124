"""The demo's details a newcomer reads: the README counts its calls as its table does, its
charge ids are the same in every process (a payment API deduplicates on them), and the
ledger it writes beside its store is ignored by git as the store is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from runifold_sync.cli.demo import STEPS_PER_ORDER, order_intake

ROOT = Path(__file__).resolve().parents[2]
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}

# The effect's body as a worker runs it, printing the charge id it returns.
CHARGE = """
import os, sys
from runifold_sync.cli.demo import Order, order_intake
from runifold_sync.workflow.step_context import StepContext
os.environ["RUNIFOLD_DEMO_LEDGER"] = sys.argv[1]
body = order_intake.steps["charge_card"].fn
print(body(StepContext("order-1", "charge_card#1", 1, 1, "order-1/charge_card#1"), Order("order-1", 1000)))
"""


def test_the_readme_counts_the_demos_calls_as_its_table_does() -> None:
    kinds = Counter(spec.kind for spec in order_intake.steps.values())
    assert sum(kinds.values()) == STEPS_PER_ORDER  # what "steps done" reaches
    readme = (ROOT / "README.md").read_text()
    try_it = readme[readme.index("\n## Try it\n") : readme.index("\n## Run the tests\n")]
    said = " ".join(try_it.split())
    assert (
        f"of {WORDS[STEPS_PER_ORDER]} calls each ({WORDS[kinds['step']]} steps and an idempotent "
        f"effect: the table's `steps done` counts all {WORDS[STEPS_PER_ORDER]})"
    ) in said
    assert kinds == {"step": 3, "effect": 1}
    assert "three steps, an idempotent effect" not in said


def test_a_charge_id_is_the_same_in_every_process(tmp_path: Path) -> None:
    """Each interpreter seeds ``hash()`` of a string at random (``PYTHONHASHSEED``): an id
    made from it would differ on the retry a crash brings, defeating deduplication."""
    charges = set()
    for seed in ("1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", CHARGE, str(tmp_path / "ledger")],
            env=os.environ | {"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        charges.add(done.stdout.strip())
    assert len(charges) == 1
    assert re.fullmatch(r"ch-[0-9a-f]{12}", charges.pop())


def test_git_ignores_the_demos_ledger_beside_its_store() -> None:
    for name in ("runifold-demo.db", "runifold-demo.ledger"):
        ignored = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"git does not ignore {name}"
