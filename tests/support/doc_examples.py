"""Every fenced block of README.md and docs/ run as a test, one pytest item per page.

Sybil parses the pages (MyST Markdown) and evaluates their examples; this module only
says how each kind of block runs and collects one item per page, so that a page's blocks
run in order in one process (pytest-xdist spreads single tests over its workers, and a
page builds on its earlier blocks). Each page runs in a fresh directory of its own:

- A ``python`` block runs in the page's namespace, in that directory (on ``sys.path``,
  as for a script run there). One whose first
  line is ``# path/to/file.py`` is a file the page shows: it is written there (and
  compiled), and a later command runs it; ``# path/to/file.py, at its end`` adds to a
  file made earlier (a settings module a command generated). A block of ``>>>`` lines is
  a doctest.
- A ``console`` block is commands (``$ ``; a line ending in ``\\`` continues) each followed
  by what it prints (``...`` matches anything; whitespace runs compare equal). The page's
  commands run in one bash process, so ``cd``, ``export`` and background jobs carry over
  from block to block, with this environment's ``python`` first on ``PATH`` and no
  ``RUNIFOLD_*`` variable set.
- A block in any other language cannot run: it fails unless marked skipped.
- ``<!-- skip: next "reason" -->`` (or ``start``/``end`` around several) skips blocks that
  cannot run alone: a server started in the foreground, a settings fragment. The reason
  is required; a condition (``skip: next if(expr, reason="...")``) skips only while it
  holds. Skipped blocks are reported as such, with their reasons.
- ``<!-- invisible-code-block: python -->`` runs setup the page does not show.

The terminal summary says how many blocks ran and were skipped, and why.
"""

from __future__ import annotations

import doctest
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Document, Example, Region
from sybil.evaluators.doctest import DocTestEvaluator
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.abstract.doctest import DocTestStringParser
from sybil.parsers.myst import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
FILE_HEADER = re.compile(r"# (?P<path>[\w./-]+\.\w+)(?P<append>, at its end)?\n")
FENCE = re.compile(
    r"^(?P<indent>[ \t]*(?:[-*+]|\d+[.)])?[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.M
)
RUNNABLE = ("python", "console")
COMMAND_TIMEOUT_S = 300.0
CHECKER = doctest.OutputChecker()
CHECK_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def documentation_pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page of the site, in a stable order."""
    docs = root / "docs"
    pages = [p for p in docs.rglob("*.md") if "_build" not in p.relative_to(docs).parts]
    return [root / "README.md", *sorted(pages)]


class Shell:
    """One bash process a page's ``console`` blocks type into, in the page's directory."""

    def __init__(self, cwd: Path) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RUNIFOLD_", "PYTEST_", "VIRTUAL_ENV"))
            and k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "FLASK_APP")
        }
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["PYTHONUNBUFFERED"] = "1"
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.marker = f"__docs_command_done_{uuid.uuid4().hex}__"

    def run(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """What ``command`` printed (standard output and error), as a terminal shows it."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        # A brace group runs in this shell (cd and export stay); no command reads the
        # page's next commands as its input.
        script = f"{{\n{command}\n}} </dev/null 2>&1\nprintf '\\n{self.marker}\\n'\n"
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        out = b""
        end = f"\n{self.marker}\n".encode()
        deadline = time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while not out.endswith(end):
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise AssertionError(f"command still running after {timeout_s:.0f} s: {command}\n{out!r}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"the shell ended during: {command}\n{out.decode()}")
                out += chunk
        return out[: -len(end)].decode(errors="replace")

    def close(self) -> None:
        """Ends the shell and whatever the page left running in the background."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Page:
    """The directory, namespace and shell one page's blocks share."""

    def __init__(self, path: Path, directory: Path) -> None:
        self.path = path
        self.directory = directory
        self._shell: Shell | None = None

    @property
    def shell(self) -> Shell:
        if self._shell is None:
            self._shell = Shell(self.directory)
        return self._shell

    def close(self) -> None:
        if self._shell is not None:
            self._shell.close()

    # -- evaluators ---------------------------------------------------------------

    def write_file(self, example: Example) -> None:
        header = FILE_HEADER.match(example.parsed)
        assert header is not None
        body = str(example.parsed)[header.end() :]
        compile(body, f"{example.path}:{example.line}", "exec", dont_inherit=True)
        target = self.directory / header["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        if header["append"]:
            with target.open("a") as file:
                file.write("\n" + body)
        else:
            target.write_text(body)

    def run_console(self, example: Example) -> None:
        __tracebackhide__ = True
        for command, want, line in console_steps(str(example.parsed)):
            got = self.shell.run(command)
            if not CHECKER.check_output(want, got, CHECK_FLAGS):
                shown = "\n".join(f"    {x}" for x in command.splitlines())
                raise AssertionError(
                    f"{example.path}, line {example.line + line}: the command\n{shown}\n"
                    f"printed:\n{_indent(got)}\nwhere the page shows:\n{_indent(want)}"
                )

    @staticmethod
    def cannot_run(example: Example) -> None:
        language = example.region.lexemes.get("arguments")
        raise AssertionError(
            f"{example.path}, line {example.line}: a ```{language} block cannot run; mark it "
            '<!-- skip: next "why it cannot run alone" --> or show it as python or console'
        )


def _indent(text: str) -> str:
    return "\n".join(f"    {x}" for x in text.rstrip("\n").splitlines()) or "    (nothing)"


def console_steps(source: str) -> Iterator[tuple[str, str, int]]:
    """(command, expected output, line within the block) for each ``$ `` of a block."""
    lines = source.splitlines()
    n = 0
    while n < len(lines):
        if not lines[n].startswith("$ "):
            raise AssertionError(f"a console block's line {n + 1} is neither a command nor its output")
        start = n
        command = [lines[n][2:]]
        while command[-1].endswith("\\") and n + 1 < len(lines):
            n += 1
            command.append(lines[n].removeprefix("> "))
        n += 1
        output = []
        while n < len(lines) and not lines[n].startswith("$ "):
            output.append(lines[n])
            n += 1
        want = "\n".join(output) + "\n" if output else ""
        yield "\n".join(command), want, start + 1


class PythonParser(CodeBlockParser):
    """``python`` blocks: code, doctests, and files the page writes."""

    def __init__(self, page: Page) -> None:
        super().__init__(language="python", evaluator=PythonEvaluator())
        self.page = page
        self.doctests = DocTestStringParser(DocTestEvaluator(CHECK_FLAGS))

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in super().__call__(document):
            source = region.parsed
            if source.startswith(">>>"):
                for doctest_region in self.doctests(source, document.path):
                    doctest_region.adjust(region, source)
                    yield doctest_region
            else:
                if FILE_HEADER.match(source) and not region.lexemes.get("directive"):
                    region.evaluator = self.page.write_file
                yield region


class ConsoleParser(CodeBlockParser):
    def __init__(self, page: Page) -> None:
        super().__init__(language="console", evaluator=page.run_console)


class OtherLanguageParser(CodeBlockParser):
    """Blocks in a language no evaluator runs: each fails unless skipped."""

    def __init__(self) -> None:
        super().__init__(language="any", evaluator=Page.cannot_run)

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexers(document):
            language = region.lexemes["arguments"]
            directive = language.startswith("{")  # a MyST directive (```{toctree}), not code
            if language not in RUNNABLE and not directive and not region.lexemes.get("directive"):
                region.parsed = region.lexemes["source"]
                region.evaluator = Page.cannot_run
                yield region


def unaccounted_fences(document: Document) -> list[int]:
    """Lines of fenced blocks no parser took: an unlabelled fence (```), most likely.
    MyST directives (```{toctree}) are not examples."""
    starts = sorted(start for start, _ in document.regions)
    missing = []
    open_fence: re.Match[str] | None = None
    for match in FENCE.finditer(document.text):
        if open_fence is None:
            open_fence = match
        elif match["fence"].startswith(open_fence["fence"]) and not match["info"].strip():
            inside = [s for s in starts if open_fence.start() <= s < match.end()]
            if not open_fence["info"].strip().startswith("{") and not inside:
                missing.append(document.text.count("\n", 0, open_fence.start()) + 1)
            open_fence = None
    return missing


class PageResult:
    def __init__(self) -> None:
        self.ran = 0
        self.skipped: list[tuple[int, str]] = []
        self.setup = 0


def run_page(path: Path, directory: Path) -> PageResult:
    """Runs every block of ``path`` in order in ``directory``; returns what ran."""
    __tracebackhide__ = True
    page = Page(path, directory)
    skip = SkipParser()
    document = Document.parse(str(path), PythonParser(page), ConsoleParser(page), OtherLanguageParser(), skip)
    missing = unaccounted_fences(document)
    assert not missing, f"{path}: fenced blocks with no language at lines {missing}"
    document.namespace["__name__"] = "__docs__"
    result = PageResult()
    before = Path.cwd()
    os.chdir(directory)
    sys.path.insert(0, str(directory))  # as `python` run in that directory finds its modules
    modules = set(sys.modules)
    environment = dict(os.environ)
    try:
        for example in document:
            if example.region.evaluator is skip.skipper:
                action, reason = example.parsed
                assert action == "end" or reason, f"{path}, line {example.line}: a skip needs a reason"
                example.evaluate()
                continue
            try:
                example.evaluate()
            except SkipTest as skipped:
                result.skipped.append((example.line, str(skipped)))
                continue
            except AssertionError:
                raise
            except Exception as error:  # what the example raised, from its own frames on
                where = f"{path}, line {example.line}"
                raise AssertionError(f"{where}: the example raised\n{_shown(error)}") from None
            if example.region.lexemes.get("directive"):
                result.setup += 1
            else:
                result.ran += 1
    finally:
        os.chdir(before)
        os.environ.clear()
        os.environ.update(environment)
        sys.path.remove(str(directory))
        for name in set(sys.modules) - modules:  # the page's own modules, not another page's
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(directory)):
                del sys.modules[name]
        page.close()
        _close_left_open(document.namespace)
    return result


def _shown(error: BaseException) -> str:
    """``error``'s traceback without the frames of the machinery that ran the example."""
    machinery = ("/sybil/", "/_pytest/", "/pluggy/", __file__)
    shown = traceback.TracebackException.from_exception(error)
    shown.stack = traceback.StackSummary.from_list(
        [frame for frame in shown.stack if not any(part in frame.filename for part in machinery)]
    )
    return "".join(shown.format())


def _close_left_open(namespace: dict[str, Any]) -> None:
    """Stores a page's code left open are closed, so that no connection or thread
    outlives its page in this test process (a page closes its workers itself)."""
    from runifold_sync import WorkflowStore

    for value in list(namespace.values()):
        if isinstance(value, WorkflowStore):
            with suppress(Exception):
                value.close()


# -- pytest ---------------------------------------------------------------------------


class PageFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        yield PageItem.from_parent(self, name="examples")


class PageItem(pytest.Item):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker(pytest.mark.timeout(600))

    def runtest(self) -> None:
        __tracebackhide__ = True
        directory = Path(tempfile.mkdtemp(prefix="runifold-docs-"))
        try:
            result = run_page(self.path, directory)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.user_properties.append(("doc_examples_ran", result.ran))
        self.user_properties.append(("doc_examples_setup", result.setup))
        for line, reason in result.skipped:
            self.user_properties.append(("doc_example_skipped", f"{self._where()}:{line}: {reason}"))

    def _where(self) -> str:
        return str(self.path.relative_to(ROOT))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)  # type: ignore[no-any-return]

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"{self._where()}: every example"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".md" and file_path in documentation_pages():
        return PageFile.from_parent(parent, path=file_path)  # type: ignore[no-any-return]
    return None


_totals: dict[str, Any] = {"pages": 0, "ran": 0, "setup": 0, "skipped": []}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    props = dict(report.user_properties) if report.user_properties else {}
    if "doc_examples_ran" not in props:
        return
    _totals["pages"] += 1
    _totals["ran"] += props["doc_examples_ran"]
    _totals["setup"] += props["doc_examples_setup"]
    _totals["skipped"].extend(v for k, v in report.user_properties if k == "doc_example_skipped")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _totals["pages"]:
        return
    skipped = _totals["skipped"]
    terminalreporter.section("documentation examples")
    terminalreporter.write_line(
        f"{_totals['pages']} pages: {_totals['ran']} examples ran, {len(skipped)} skipped "
        f"({_totals['setup']} hidden setup blocks ran too)"
    )
    for line in sorted(skipped):
        terminalreporter.write_line(f"  skipped {line}")
