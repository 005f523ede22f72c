"""Documentation that runs: every docstring example of the package, and the README's
"Quickstart" and "Resuming a training run" examples, are executed here so they cannot rot;
the user guide's command-line section is checked against the parser."""

from __future__ import annotations

import argparse
import ast
import doctest
import glob
import importlib
import os
import pkgutil
import re

import pytest
import shardstream

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
GUIDE = os.path.join(ROOT, "docs", "guide.md")

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
    """The full DataLoader + checkpoint example runs as written and its own check passes (the
    resumed run's batches equal one uninterrupted run), resuming inside a set_epoch loop in a
    later epoch than the first."""
    code = run_readme_example("Resuming a training run", tmp_path, monkeypatch)
    for needle in (
        "StatefulDataLoader",
        "torch.save",
        "weights_only=True",
        "load_state_dict",
        "set_epoch",
    ):
        assert needle in code
    out = capsys.readouterr().out
    m = re.search(r"resumed at step (\d+) in epoch (\d+), finished at step (\d+)", out)
    assert m and int(m[2]) >= 1 and int(m[3]) > int(m[1]), out
    assert os.path.exists(tmp_path / "ckpt.pt")


def test_install_and_cli_sections_match_the_code():
    install = readme_section("Install")
    assert "pip install shardstream" in install
    assert "make wheel && pip install dist/*.whl" in install
    assert "cp310-abi3" in install and "3.10" in install and "manylinux2014" in install
    cli_section = doc_section(GUIDE, "Command line")
    from shardstream import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # every subcommand is documented
        assert f"`{name} " in cli_section or f"`{name}`" in cli_section, name


def test_cli_section_names_every_option():
    """Each subcommand's row in the guide's command-line table names all of its options."""
    from shardstream import cli

    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\| `(\w+) [^\n]*", doc_section(GUIDE, "Command line"), re.M)
    }
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        assert name in rows, f"no table row for `{name}`"
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # internal (e.g. demo's child process), not documented
            for opt in action.option_strings:
                if opt not in ("-h", "--help"):
                    assert opt in rows[name], f"`{name}` row does not name {opt}"


# ------------------------------------------------------------------ links, paths, identifiers

DOCS = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def prose(path: str) -> str:
    """A Markdown file without its fenced code blocks."""
    with open(path, encoding="utf-8") as f:
        return re.sub(r"^```.*?^```", "", f.read(), flags=re.S | re.M)


def anchors(path: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", prose(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = sum(1 for a in out if a == slug or re.fullmatch(rf"{re.escape(slug)}-\d+", a))
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_doc_links_resolve(doc):
    """Every relative link points at a file that exists, and every #anchor at a heading."""
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(doc)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(full):
            bad.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(full):
            bad.append(f"{target}: no heading with that anchor")
    assert not bad, bad


def named_paths(doc: str) -> list[str]:
    """Repository paths the doc names in backticks (brace lists expanded, patterns skipped)."""
    out = []
    for span in re.findall(r"`([^`\n]+)`", prose(doc)):
        m = re.fullmatch(r"((?:rust|python|tests|benches|docs|\.ci)/[\w./{},-]*)(?:::\S*)?", span)
        if not m:
            continue
        path = m.group(1)
        braces = re.search(r"\{([^}]*)\}", path)
        parts = braces.group(1).split(",") if braces else [""]
        for part in parts:
            out.append(path[: braces.start()] + part + path[braces.end() :] if braces else path)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_doc_paths_exist(doc):
    """Files and directories the docs name exist (a moved file must take its docs along)."""
    missing = [p for p in named_paths(doc) if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing


def rust_sources() -> str:
    text = []
    for path in sorted(glob.glob(os.path.join(ROOT, "rust", "**", "*.rs"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            text.append(f.read())
    return "\n".join(text)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_doc_rust_functions_exist(doc):
    """`Type::function` and `module::function` of shardstream's own Rust code that the docs
    name are defined there (names of other crates, e.g. `object_store::...`, are not checked)."""
    src = rust_sources()
    ours = set(re.findall(r"\b(?:struct|enum|trait|type|mod)\s+([A-Za-z_]\w*)", src))
    ours |= {
        os.path.splitext(os.path.basename(p))[0]
        for p in glob.glob(os.path.join(ROOT, "rust", "*", "src", "*.rs"))
    }
    missing = []
    for owner, name in re.findall(r"`([A-Za-z_]\w*)::([a-z_]\w*)", prose(doc)):
        if owner in ours and not re.search(rf"\bfn\s+{name}\b", src):
            missing.append(f"{owner}::{name}")
    assert not missing, missing


# ------------------------------------------------------------------ the state format page

STATE_FORMAT = os.path.join(ROOT, "docs", "state-format.md")


def shape(obj):
    """Keys and value types of a state, recursively (lists by their first item)."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    return type(obj).__name__


def leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, (*path, i))
    else:
        yield path, obj


def quickstart_data(tmp_path) -> str:
    from shardstream.datagen import write_shards

    data = str(tmp_path / "data" / "train")
    write_shards(data, num_shards=4, rows_per_shard=2_500)
    return data


def test_state_format_example_is_a_real_state(tmp_path):
    """The example on the page is what state_dict() returns in the situation it describes:
    same keys and types, same values except the digests of the files' bytes (which depend on
    the pyarrow version that wrote them)."""
    from shardstream import ParquetStream

    block = python_blocks(doc_section(STATE_FORMAT, "An example"))[0]
    documented = ast.literal_eval(re.sub(r"#[^\n]*", "", block))
    ds = ParquetStream(
        quickstart_data(tmp_path), columns=["id"], batch_size=64, shuffle_buffer=4, seed=0
    )
    it = iter(ds)
    next(it)
    next(it)
    ds.skip(1)
    real = ds.state_dict()
    assert shape(documented) == shape(real)
    volatile = {
        ("fingerprint", "content"),
        ("fingerprint", "buckets"),
        ("position", "seek", "byte_offset"),
    }
    want = {p: v for p, v in leaves(documented) if p not in volatile}
    assert want == {p: v for p, v in leaves(real) if p not in volatile}


def test_state_format_documents_every_key(tmp_path):
    """Every key a state can hold (elastic specs included) is described on the page."""
    from shardstream import ParquetStream

    data = quickstart_data(tmp_path)

    def stream(rank, world):
        return ParquetStream(
            data, batch_size=64, shuffle_buffer=4, rank=rank, world_size=world, even=None
        )

    old = []
    for rank in range(2):
        ds = stream(rank, 2)
        next(iter(ds))
        ds.skip(1)
        old.append(ds.state_dict())
    new = stream(0, 3)
    new.load_state_dict(old)  # another layout: the position carries specs
    state = new.state_dict()
    assert state["position"]["specs"] and state["skips"]
    keys = {k for path, _ in leaves(state) for k in path if isinstance(k, str)}
    with open(STATE_FORMAT, encoding="utf-8") as f:
        page = f.read()
    assert [k for k in sorted(keys) if f"| `{k}`" not in page and f"`{k}` (" not in page] == []


def test_guide_signature_matches_the_code():
    """The guide's ParquetStream signature has the code's parameters, order and defaults, and
    its argument table has a row for every parameter."""
    import inspect

    from shardstream import ParquetStream

    section = doc_section(GUIDE, "ParquetStream")
    call = re.search(r"ds = ParquetStream\((.*?)\)\n", python_blocks(section)[0], re.S)
    assert call, "no `ds = ParquetStream(...)` in the guide's ParquetStream section"
    documented = re.sub(r"\s+", " ", call.group(1)).strip()
    parts = []
    for p in inspect.signature(ParquetStream).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        default = f'"{p.default}"' if isinstance(p.default, str) else repr(p.default)
        parts.append(p.name if p.default is p.empty else f"{p.name}={default}")
    assert documented == ", ".join(parts)
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    for name in inspect.signature(ParquetStream).parameters:
        assert f"`{name}`" in table, f"the argument table has no row for `{name}`"


def test_guide_mixture_example(tmp_path, monkeypatch, capsys):
    """The guide's pretraining mixture (3 sources, a linear schedule, a resume that changes the
    weights and resizes 2 -> 3 ranks) runs as written; its first batch after the resume holds
    the new weights to within one row per source."""
    blocks = python_blocks(doc_section(GUIDE, "Mixtures of named sources"))
    code = blocks[0]
    for needle in ("schedule=", "load_state_dict(states)", "mixture(anneal, rank, 3)"):
        assert needle in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{GUIDE}:Mixtures", "exec"), {"__name__": "__guide__"})
    names, counts = ast.literal_eval(capsys.readouterr().out.splitlines()[0].replace("] [", "], ["))
    weights = {"web": 0.2, "code": 0.3, "books": 0.5}
    assert sum(counts) == 32
    assert all(abs(c - 32 * weights[n]) < 1 for n, c in zip(names, counts, strict=True))


def test_state_format_mixture_example_and_keys(tmp_path):
    """The Mixture example on the state-format page is a real state of the mixture it describes
    (its sources' stream states shortened to their format), and every key a mixture state can
    hold (a stratified block, a removed source) is described on the page."""
    from shardstream import Mixture, ParquetStream
    from shardstream.datagen import write_shards

    section = doc_section(STATE_FORMAT, "Mixtures (`shardstream.Mixture`)")
    block = re.sub(r", \.\.\.\}", "}", re.sub(r"#[^\n]*", "", python_blocks(section)[0]))
    documented = ast.literal_eval(block)
    write_shards(str(tmp_path / "web"), num_shards=2, rows_per_shard=500, seed=0)
    write_shards(str(tmp_path / "code"), num_shards=1, rows_per_shard=300, seed=1, start_id=1000)

    def src(names, **kw):
        all_ = {
            "web": ParquetStream(str(tmp_path / "web"), columns=["id"], shuffle_buffer=2, seed=1),
            "code": ParquetStream(str(tmp_path / "code"), columns=["id"]),
        }
        weights = {"web": 0.75, "code": 0.25}
        return Mixture(
            {n: all_[n] for n in names},
            weights={n: weights[n] for n in names},
            batch_size=8,
            on_exhausted={"code": "drop"} if "code" in names else "cycle",
            **kw,
        )

    m = src(["web", "code"])
    it = iter(m)
    next(it)
    next(it)
    real = m.state_dict()
    assert {n: {"format": s["format"]} for n, s in real["sources"].items()} == documented.pop(
        "sources"
    )
    assert {k: v for k, v in real.items() if k != "sources"} == documented
    # Every key, with a stratified block and a removed source.
    strat = src(["web", "code"], mixing="stratified", block=24)  # 3 batches per block
    it = iter(strat)
    next(it)
    one = src(["web"], mixing="stratified", block=24)
    one.load_state_dict(strat.state_dict())
    next(iter(one))
    state = one.state_dict()
    assert state["removed"] and state["mixer"]["block"]
    names = {"web", "code"}
    keys = {k for path, _ in leaves(state) for k in path if isinstance(k, str)} - names
    sub = {k for p, _ in leaves(state["sources"]) for k in p if isinstance(k, str)} - names
    sub |= {k for p, _ in leaves(state["removed"]) for k in p if isinstance(k, str)} - names
    mixture_keys = keys - sub | set(state)
    assert [
        k for k in sorted(mixture_keys) if f"| `{k}`" not in section and f"`{k}`" not in section
    ] == []
