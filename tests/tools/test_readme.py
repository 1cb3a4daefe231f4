"""The README is the front door, and stays one: short, its quick start the two setup
scripts, every relative link alive, and every Python example running as a user runs it
(a fresh process, nothing imported for it). The reference lives in docs/USAGE.md, whose
links are checked the same way."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINKED_DOCS = [README, ROOT / "docs" / "USAGE.md"]
MAX_LINES = 150  # past this the README turns back into the manual: move prose to docs/USAGE.md
QUICK_START = ["bash scripts/demo.sh", "bash scripts/test.sh"]
EXAMPLE_TIMEOUT_S = 180

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def fenced_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the ```lang blocks of a markdown text, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```\s*$", text, re.MULTILINE | re.DOTALL)


def section(text: str, title: str) -> str:
    """The body of the `## title` section, up to the next heading of that level."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a markdown file's headings: lower case, punctuation dropped
    (hyphens kept), spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def examples() -> list:
    """Each ```python block of the README, named by its section and place in it."""
    params, text = [], README.read_text()
    for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL):
        slug = re.sub(r"[^a-z0-9]+", "-", m.group(1).lower()).strip("-")
        for i, code in enumerate(fenced_blocks(m.group(2), "python")):
            params.append(pytest.param(code, id=f"{slug}-{i}"))
    return params


# ---------------------------------------------------------------- shape
def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, (f"README.md has {n} lines, over {MAX_LINES}: move reference "
                            "material to docs/USAGE.md and link it")


def test_quick_start_is_the_two_setup_scripts():
    blocks = fenced_blocks(section(README.read_text(), "Quick start"), "bash")
    assert len(blocks) == 1, f"the quick start should hold one bash block, not {len(blocks)}"
    assert blocks[0].splitlines() == QUICK_START
    for command in QUICK_START:
        script = ROOT / command.split()[1]
        assert script.is_file(), f"{command}: no such script"
        assert os.access(script, os.X_OK), f"{script.name} is not executable"
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), f"{script.name} is not a bash script"
        assert "scripts/setup.sh" in text, f"{script.name} does not set the environment up"
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, f"bash -n {script.name}: {r.stderr}"


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda p: p.name)
def test_relative_links_point_at_files(doc):
    broken = []
    for target in _LINK.findall(doc.read_text()):
        if _SCHEME.match(target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest.read_text()):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: " + "; ".join(broken)


# ---------------------------------------------------------------- the examples
def test_readme_has_examples():
    assert len(examples()) >= 4  # a CUDA script, Debug, DeferAndFuse, torch.compile


@pytest.mark.slow  # a fresh interpreter per example, 6-9 s each on 2 cores
@pytest.mark.parametrize("code", examples())
def test_readme_example_runs(code, tmp_path):
    """Each example, saved as a script and run in a fresh interpreter, exits 0 and prints
    what it says it prints (an example whose point is a caught error prints only if it
    caught it)."""
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert r.returncode == 0, f"exit code {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip(), f"the example printed nothing\n{r.stderr}"
