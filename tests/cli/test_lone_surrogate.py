"""A command-line argument that was not valid UTF-8 reaches Python as a lone surrogate
(``surrogateescape``): a name holding one is refused as what it is, not as holding
"control characters"."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import processes


def test_an_argument_that_was_not_utf8_is_named_a_lone_surrogate(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    # "order-\udcff" is what Python makes of the argument bytes b"order-\xff"
    done = processes.run(
        "runifold_sync",
        "enqueue",
        "flow",
        "1",
        "--checkpoint-id",
        "order-\udcff",
        "--database",
        url,
        "--json",
        timeout_s=60,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout) == {
        "error": "checkpoint id contains a lone surrogate U+DCFF, which is not a Unicode character "
        "(was it made from bytes that are not UTF-8?): 'order-\\udcff'",
        "type": "InvalidArgument",
    }
    assert "control characters" not in done.stderr
