"""The documentation site: it builds with every link and anchor resolved, its generated references are
committed as the generator writes them now and cover the schemas and the parser whole, getting started
names every verb, and every description of what launcher does names the same five backends."""

from __future__ import annotations

import argparse
import difflib
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, require, run_cli
from launcher.cli import build_parser

BACKENDS = ("local processes", "Docker", "Slurm", "Kubernetes", "OCI Data Science Jobs")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with ``mkdocs build --strict`` as a user (or CI) builds it."""
    require(importlib.util.find_spec("mkdocs") is not None, "mkdocs is not installed (pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its future
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]
    assert not warnings, "\n".join(warnings)
    return out


def _property_names(node: Any) -> Iterator[str]:
    """Every key of every ``properties`` mapping anywhere in a schema, whatever keyword holds it."""
    if isinstance(node, dict):
        for name, sub in node.get("properties", {}).items():
            yield name
            yield from _property_names(sub)
        for key, sub in node.items():
            if key != "properties":
                yield from _property_names(sub)
    elif isinstance(node, list):
        for sub in node:
            yield from _property_names(sub)


def _table_keys(page: str) -> set[str]:
    """The code in the first cell of each table row of a built page (or a part of one)."""
    return {html.unescape(key) for key in re.findall(r"<tr>\s*<td><code>([^<]*)</code>", page)}


def test_the_site_builds_strict_and_offline(site):
    for page in ("index.html", "getting-started/index.html", "backends/kubernetes/index.html",
                 "reference/spec/index.html", "reference/cli/index.html", "protocol/index.html"):
        assert (site / page).is_file(), page
    for page in site.rglob("*.html"):  # nothing fetched from elsewhere: the site renders offline
        remote = re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="(?:https?:)?//[^"]*"', page.read_text())
        assert not remote, (page, remote)


def _generator() -> Any:
    """scripts/reference.py, the one generator of docs/reference/, as a module."""
    spec = importlib.util.spec_from_file_location("reference", REPO / "scripts" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_references_are_what_the_generator_writes_now():
    generator = _generator()
    stale = []
    for path, text in generator.pages().items():
        committed = path.read_text() if path.is_file() else ""
        if committed != text:
            diff = difflib.unified_diff(committed.splitlines(), text.splitlines(), "committed", "generated",
                                        lineterm="")
            stale.append(f"{path.relative_to(REPO)}:\n" + "\n".join(list(diff)[:20]))
    assert not stale, (f"the committed references differ from schemas/ and launcher/cli.py; regenerate them with "
                       f"`{generator.COMMAND}` and commit the result\n" + "\n".join(stale))


def test_the_spec_reference_names_every_property_of_every_schema(site):
    documented = _table_keys((site / "reference/spec/index.html").read_text())
    schemas = sorted((REPO / "schemas").glob("*.json"))
    assert schemas
    for path in schemas:
        names = set(_property_names(json.loads(path.read_text())))
        assert {"workDir", "minNodes", "gpusPerNode", "queueName", "shapeConfigDetails"} <= names
        assert names - documented == set(), path.name


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert len(actions) == 1
    return dict(actions[0].choices)


def test_the_cli_reference_names_every_subcommand_and_option(site):
    page = (site / "reference/cli/index.html").read_text()
    sections = dict(re.findall(r'<h2 id="launcher-([a-z-]+)"(.*?)(?=<h2 |</article>)', page, re.S))
    subcommands = _subcommands(build_parser())
    assert {"init", "run", "watch", "timeline", "scale"} <= set(subcommands)
    assert set(sections) == set(subcommands)
    for name, sub in subcommands.items():
        options = " ".join(_table_keys(sections[name]))
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):  # -h is argparse's own, the same on every verb
                for option in action.option_strings:
                    assert option in options.replace(",", " ").split(), (name, option)


def test_getting_started_names_every_verb():
    page = (REPO / "docs" / "getting-started.md").read_text()
    verbs = page.split("\n## The verbs\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^launcher ([a-z-]+)", verbs, re.M))
    assert set(_subcommands(build_parser())) - named == set(), "add them to The verbs in docs/getting-started.md"


def test_help_names_the_five_backends():
    done = run_cli("--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    missing = [backend for backend in BACKENDS if backend not in text]
    assert not missing, text


def test_package_description_and_readme_name_the_same_backends():
    description = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["description"]
    readme_opening = (REPO / "README.md").read_text().split("\n\n")[1]
    parser_description = build_parser().description
    for text in (description, " ".join(readme_opening.split()), parser_description):
        assert [backend for backend in BACKENDS if backend not in text] == [], text


def test_each_verbs_own_help_says_what_it_does():
    [verbs] = [action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)]
    helps = {action.dest: action.help for action in verbs._choices_actions}
    for name, parser in verbs.choices.items():
        assert parser.description == helps[name] and len(helps[name]) > 10, name
    shown = run_cli("top", "--help")
    assert "live CPU, memory, GPU use" in shown.stdout and "docs/health.md" in shown.stdout, shown.stdout
