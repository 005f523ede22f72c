"""Documentation that runs: every docstring example of the package, and the README's
"Resuming a training run" example, are executed here so they cannot rot."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import re

import pytest
import shardstream

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")

MODULES = sorted(
    ["shardstream"] + [m.name for m in pkgutil.walk_packages(shardstream.__path__, "shardstream.")]
)

# Modules whose docstrings must keep at least one example (so "documented by example" stays true).
MUST_HAVE_EXAMPLES = {
    "shardstream.cli",
    "shardstream.cli._common",
    "shardstream.cli._progress",
    "shardstream.cli.inspect",
    "shardstream.cli.state",
    "shardstream.datagen",
    "shardstream.dataset",
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
    assert "shardstream.cli.state" in MODULES  # modules of subpackages too


def readme_section(title: str) -> str:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def python_blocks(section: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)


def test_readme_resuming_a_training_run(tmp_path, monkeypatch, capsys):
    """The full DataLoader + checkpoint example runs as written and its own check passes
    (the resumed run's batches equal one uninterrupted epoch)."""
    blocks = python_blocks(readme_section("Resuming a training run"))
    assert len(blocks) == 1, "the section should hold exactly one complete example"
    code = blocks[0]
    for needle in ("StatefulDataLoader", "torch.save", "weights_only=True", "load_state_dict"):
        assert needle in code
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(code, f"{README}:Resuming a training run", "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"resumed at step \d+, finished the epoch at step \d+", out), out
    assert os.path.exists(tmp_path / "ckpt.pt")


def test_readme_install_and_cli_sections_match_the_code():
    install = readme_section("Install")
    assert "pip install shardstream" in install
    assert "make wheel && pip install dist/*.whl" in install
    assert "cp310-abi3" in install and "3.10" in install
    cli_section = readme_section("Command line")
    from shardstream import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # every subcommand is documented
        assert f"`{name} " in cli_section or f"`{name}`" in cli_section, name
