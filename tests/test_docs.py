"""Documentation that runs: every docstring example of the package, and the README's
"Quickstart" and "Resuming a training run" examples, are executed here so they cannot rot;
the user guide's command-line section is checked against the parser."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import re

import pytest
import shardstream

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
GUIDE = os.path.join(ROOT, "docs", "guide.md")

MODULES = sorted(
    ["shardstream"] + [m.name for m in pkgutil.iter_modules(shardstream.__path__, "shardstream.")]
)

# Modules whose docstrings must keep at least one example (so "documented by example" stays true).
MUST_HAVE_EXAMPLES = {
    "shardstream.cli",
    "shardstream.datagen",
    "shardstream.dataset",
    "shardstream._progress",
}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    res = doctest.testmod(
        module,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
        report=True,
    )
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctest examples failed in {name}"
    if name in MUST_HAVE_EXAMPLES:
        assert res.attempted > 0, f"{name} lost its docstring examples"


def test_every_module_is_checked():
    assert MUST_HAVE_EXAMPLES <= set(MODULES)
    assert "shardstream.cli" in MODULES and "shardstream.dataset" in MODULES


def doc_section(path: str, title: str) -> str:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{os.path.relpath(path, ROOT)} has no '## {title}' section"
    return m.group(1)


def readme_section(title: str) -> str:
    return doc_section(README, title)


def python_blocks(section: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)


def run_readme_example(title: str, tmp_path, monkeypatch) -> str:
    """Run the one ``python`` block of a README section as written, in ``tmp_path`` (where it
    writes its demo data), and return the block's code."""
    blocks = python_blocks(readme_section(title))
    assert len(blocks) == 1, f"the section '{title}' should hold exactly one complete example"
    code = blocks[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code, f"{README}:{title}", "exec"), namespace)
    return code


def test_readme_quickstart(tmp_path, monkeypatch, capsys):
    """The Quickstart runs as written on its own demo data, and its own check passes (the
    resumed dataset's first batch is the batch the first one yields next)."""
    code = run_readme_example("Quickstart", tmp_path, monkeypatch)
    for needle in ("write_shards", "state_dict()", "load_state_dict", "assert "):
        assert needle in code
    assert capsys.readouterr().out == "10000 4 ['id', 'tokens']\n"
    assert sorted(os.listdir(tmp_path / "data" / "train")) == [
        f"shard-0000{i}.parquet" for i in range(4)
    ]


def test_readme_resuming_a_training_run(tmp_path, monkeypatch, capsys):
    """The full DataLoader + checkpoint example runs as written and its own check passes
    (the resumed run's batches equal one uninterrupted epoch)."""
    code = run_readme_example("Resuming a training run", tmp_path, monkeypatch)
    for needle in ("StatefulDataLoader", "torch.save", "weights_only=True", "load_state_dict"):
        assert needle in code
    out = capsys.readouterr().out
    assert re.search(r"resumed at step \d+, finished the epoch at step \d+", out), out
    assert os.path.exists(tmp_path / "ckpt.pt")


def test_install_and_cli_sections_match_the_code():
    install = readme_section("Install")
    assert "pip install shardstream" in install
    assert "make wheel && pip install dist/*.whl" in install
    assert "cp310-abi3" in install and "3.10" in install
    cli_section = doc_section(GUIDE, "Command line")
    from shardstream import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # every subcommand is documented
        assert f"`{name} " in cli_section or f"`{name}`" in cli_section, name
