"""The command line: ``python -m shardstream inspect|state|demo|bench`` and ``cli.main``.

Subprocess runs check what a user sees (exit status, stdout, stderr without tracebacks);
in-process ``cli.main([...])`` runs cover the rest cheaply. ``inspect --json`` is compared with
pyarrow's own reading of the footers; ``state`` reads states made by the real API.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import shardstream
import torch
from shardstream import ParquetStream, cli, datagen
from shardstream.cli import inspect as cli_inspect
from shardstream.cli._progress import Progress
from shardstream.cli.state import describe_state

PY = sys.executable


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [PY, "-m", "shardstream", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def assert_clean_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    err = proc.stderr.strip()
    assert err, "an error must say something on stderr"
    for n in needles:
        assert n in err, (n, err)


def main_rc(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# --------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def pi_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-pi")
    datagen.write_shards(d, num_shards=3, rows_per_shard=[500, 300, 0], seed=1)
    return str(d)


@pytest.fixture(scope="module")
def nopi_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-nopi")
    datagen.write_shards(
        d, num_shards=2, rows_per_shard=[400, 250], row_group_size=100, page_index=False
    )
    return str(d)


def _settings() -> dict:
    return dict(columns=["id"], batch_size=10, shuffle_buffer=50, seed=7)


def _stream(d: str) -> ParquetStream:
    return ParquetStream(d, **_settings())


def _state_after(d: str, batches: int) -> dict:
    ds = _stream(d)
    it = iter(ds)
    for _ in range(batches):
        next(it)
    return ds.state_dict()


# --------------------------------------------------------------------------- basics


def test_help_lists_commands_and_version(capsys):
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    for cmd in ("inspect", "state", "demo", "bench"):
        assert cmd in proc.stdout
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"shardstream {shardstream.__version__} (")


def test_usage_errors_exit_2(capsys):
    assert_clean_error(run_cli("frobnicate"), 2, "invalid choice", "usage")
    for argv in ([], ["inspect"], ["state", "f", "--bogus"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        assert "usage" in capsys.readouterr().err


def test_main_module_is_thin_and_console_script_works():
    import shardstream.__main__ as m

    assert m.main is cli.main
    script = shutil.which("shardstream", path=os.path.dirname(PY))
    if script is None:
        pytest.skip("no console script next to this interpreter")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "inspect" in proc.stdout, proc.stderr


def test_adding_a_command_is_a_registration(capsys):
    """Room for ``index``: a new subcommand is one function appended to COMMANDS."""

    def add_hello(sub):
        p = sub.add_parser("hello")
        p.add_argument("name")
        p.set_defaults(run=lambda a: print(f"hi {a.name}") or 0)

    cli.COMMANDS.append(add_hello)
    try:
        assert main_rc(capsys, "hello", "you") == (0, "hi you\n", "")
    finally:
        cli.COMMANDS.remove(add_hello)


def _subparsers(parser):
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_help_is_plain_text_not_rst():
    """--help of every command shows no reStructuredText markup (``literals``, :func:`roles`,
    "::" literal-block markers) from the docstrings it is built from."""
    import re

    parser = cli.build_parser()
    commands = _subparsers(parser)
    assert set(commands) == {"inspect", "state", "index", "demo", "bench"}
    for name, p in [("", parser), *commands.items()]:
        text = p.format_help()
        assert "``" not in text, (name, text)
        assert not re.search(r":[a-z]+:`", text), (name, text)
        assert not re.search(r"::$", text, re.M), (name, text)
        assert ">>>" not in text, (name, text)
    # The docstrings they come from do hold such markup (so this test can fail).
    assert "``" in (cli.demo.__doc__ or "") and "``" in (cli.bench.__doc__ or "")
    assert ":func:`" in (shardstream.index.__doc__ or "")


def test_write_fresh_shards_replaces_an_earlier_layout(tmp_path):
    from shardstream.cli._common import write_fresh_shards

    datagen.write_shards(tmp_path, num_shards=5, rows_per_shard=3)  # an earlier run's layout
    (tmp_path / "notes.txt").write_text("kept")
    paths = write_fresh_shards(str(tmp_path), 10, 3, desc="writing", seed=4)
    assert sorted(os.listdir(tmp_path)) == [
        "notes.txt",
        "shard-00000.parquet",
        "shard-00001.parquet",
        "shard-00002.parquet",
    ]
    assert [pq.read_metadata(p).num_rows for p in paths] == [4, 3, 3]
    ids = [i for p in paths for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]
    assert ids == list(range(10))
    tokens = pq.read_table(paths[0], columns=["tokens"]).column("tokens").to_pylist()
    assert tokens == [datagen.expected_tokens(i, tokens_len=(16, 128)) for i in range(4)]
    assert pq.ParquetFile(paths[0]).metadata.row_group(0).column(0).has_offset_index


# --------------------------------------------------------------------------- inspect


def _pyarrow_view(root: str) -> dict:
    """What pyarrow reads from the same footers, keyed by path relative to ``root``."""
    out = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        md = pq.ParquetFile(path).metadata
        rgs = [md.row_group(i) for i in range(md.num_row_groups)]
        out[name] = {
            "rows": md.num_rows,
            "size": os.path.getsize(path),
            "rg_rows": [rg.num_rows for rg in rgs],
            "rg_bytes": [
                sum(rg.column(j).total_compressed_size for j in range(rg.num_columns)) for rg in rgs
            ],
            "page_index": bool(rgs)
            and all(rg.column(j).has_offset_index for rg in rgs for j in range(rg.num_columns)),
        }
    return out


@pytest.mark.parametrize("which", ["pi", "nopi"])
def test_inspect_json_matches_pyarrow(which, pi_data, nopi_data):
    root = pi_data if which == "pi" else nopi_data
    proc = run_cli("inspect", root, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no progress bar or noise when not a TTY
    info = json.loads(proc.stdout)
    want = _pyarrow_view(root)
    got = {s["rel_path"]: s for s in info["shards"]}
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g["rows"] == w["rows"]
        assert g["size"] == w["size"]
        assert [r["rows"] for r in g["row_groups"]] == w["rg_rows"]
        assert [r["bytes"] for r in g["row_groups"]] == w["rg_bytes"]
        if w["rows"]:
            assert g["page_index"] == w["page_index"] == (which == "pi")
    t = info["totals"]
    assert t["shards"] == len(want)
    assert t["rows"] == sum(w["rows"] for w in want.values())
    assert t["size"] == sum(w["size"] for w in want.values())
    assert t["row_groups"] == sum(len(w["rg_rows"]) for w in want.values())
    first = os.path.join(root, sorted(want)[0])
    schema = pq.read_schema(first)
    assert [c["name"] for c in info["schema"]] == schema.names
    assert [c["type"] for c in info["schema"]] == [str(f.type) for f in schema]
    assert info["fingerprint"]["rows"] == t["rows"]
    r = info["resume"]
    if which == "pi":
        assert r["verdict"] == "fast" and r["shards_without_page_index"] == []
    else:
        assert r["verdict"] == "ok"
        assert sorted(r["shards_without_page_index"]) == sorted(want)
        assert r["worst_case_rows"] == 100
        assert any("write_page_index=True" in a for a in r["advice"])


def test_inspect_text_table(capsys, nopi_data):
    rc, out, err = main_rc(capsys, "inspect", nopi_data)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["shard", "rows", "row"]
    body = [ln for ln in lines[1:3]]
    assert body[0].split()[:3] == ["shard-00000.parquet", "400", "4"]
    assert body[0].rstrip().endswith("NO")
    assert "2 shards, 650 rows, 7 row groups" in out
    assert "page index in 0 of 2 shards" in out
    assert "resume: ok" in out and "write_page_index=True" in out


def test_inspect_flags_huge_row_groups_without_page_index(capsys, nopi_data, monkeypatch):
    monkeypatch.setattr(cli_inspect, "SLOW_ROW_GROUP_ROWS", 100)
    rc, out, _ = main_rc(capsys, "inspect", nopi_data, "--json")
    info = json.loads(out)
    assert rc == 0 and info["resume"]["verdict"] == "slow"
    assert info["resume"]["slow_shards"] == ["shard-00000.parquet", "shard-00001.parquet"]
    rc, out, _ = main_rc(capsys, "inspect", nopi_data)
    assert "resume: slow" in out and "slow resume:" in out


def test_inspect_columns(capsys, pi_data):
    rc, out, _ = main_rc(capsys, "inspect", pi_data, "--columns", "tokens", "id", "--json")
    assert rc == 0
    assert [c["name"] for c in json.loads(out)["schema"]] == ["tokens", "id"]
    rc, out, err = main_rc(capsys, "inspect", pi_data, "--columns", "nope")
    assert rc == 2 and out == "" and "nope" in err and err.startswith("shardstream inspect: error:")


def test_inspect_bad_input(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    assert_clean_error(run_cli("inspect", missing), 2, "shardstream inspect: error:", missing)
    bogus = tmp_path / "bogus.parquet"
    bogus.write_bytes(b"this is not parquet at all")
    rc, out, err = main_rc(capsys, "inspect", str(bogus))
    assert rc == 2 and str(bogus) in err and "Parquet" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = main_rc(capsys, "inspect", str(empty))
    assert rc == 2 and str(empty) in err


# --------------------------------------------------------------------------- state


def _loader_state(d: str, workers: int = 2, batches: int = 7) -> dict:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(_stream(d), batch_size=None, num_workers=workers)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    st = loader.state_dict()
    del it
    return st


def test_state_torch_checkpoint_with_matching_source(tmp_path, capsys, pi_data):
    loader_state = _loader_state(pi_data)
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.zeros(4)}, "loader": loader_state, "step": 7}, ckpt)
    proc = run_cli("state", str(ckpt), "--source", pi_data, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "torch.save" and out["all_match"] is True
    assert out["together_error"] is None
    from shardstream.state import gather

    expected = gather(loader_state)
    assert len(out["states"]) == len(expected) == 2
    rows = 800
    for got, st in zip(out["states"], expected, strict=True):
        pos = st["position"]
        assert "['loader']" in got["where"] and got["matches_source"] is True
        assert got["slot"] == {"index": st["slot"]["index"], "count": 2, "even": "off"}
        assert got["epoch"] == pos["epoch"] == 0
        assert got["emitted"] == pos["emitted"] > 0
        assert got["cursor"] == pos["cursor"]
        assert got["buffer_rows"] == len(pos["buffer"].encode("latin-1")) // 8 > 0
        assert got["rows_per_epoch"] == rows / 2
        assert got["percent"] == pytest.approx(100 * pos["emitted"] / (rows / 2), abs=0.01)
        assert got["fingerprint"] == st["fingerprint"]
        assert got["settings"] == st["settings"]
    # Text output: one block per state, "matches", exit 0.
    rc, out, err = main_rc(capsys, "state", str(ckpt), "--source", pi_data)
    assert rc == 0, err
    assert out.count("source       matches") == 2
    assert "state 2 of 2" in out and "rows yielded this epoch" in out
    assert "can be loaded" in out


def test_state_json_with_other_source_exits_1(tmp_path, capsys, pi_data, nopi_data):
    st = _state_after(pi_data, 3)
    f = tmp_path / "state.json"
    f.write_text(json.dumps(st))
    rc, out, err = main_rc(capsys, "state", str(f), "--source", pi_data)
    assert rc == 0, err
    rc, out, err = main_rc(capsys, "state", str(f), "--source", nopi_data)
    assert rc == 1 and err == ""
    assert "DOES NOT MATCH" in out and "MISMATCH" in out
    rc, out, _ = main_rc(capsys, "state", str(f), "--source", nopi_data, "--json")
    res = json.loads(out)
    assert rc == 1 and res["all_match"] is False and res["states"][0]["matches_source"] is False
    assert "shard" in res["states"][0]["source_error"]  # says the shard set differs
    # Same data, other settings in the state: the mismatch names the setting.
    other = copy.deepcopy(st)
    other["settings"]["seed"] = 8
    f.write_text(json.dumps(other))
    ds = ParquetStream(pi_data, **{**_settings(), "seed": 8})
    with pytest.raises(Exception):  # noqa: B017 - the settings really differ from the position
        ds.load_state_dict(other)
    rc, out, _ = main_rc(capsys, "state", str(f), "--source", pi_data, "--json")
    assert rc == 1 and json.loads(out)["states"][0]["source_error"]


def test_state_not_started_and_pickle(tmp_path, capsys, pi_data):
    st = _stream(pi_data).state_dict()  # nothing read yet
    f = tmp_path / "state.pkl"
    f.write_bytes(pickle.dumps({"data": st}))
    rc, out, err = main_rc(capsys, "state", str(f), "--source", pi_data)
    assert rc == 0, err
    assert "not started" in out and "pickle" in out and "none (nothing read yet)" in out


def _with_skips(d: str) -> tuple[dict, bool]:
    """A state with skip records: ds.skip() if this shardstream has it, else a real state
    with a hand-made version-2 ``skips`` list (what ``skip`` would record)."""
    ds = _stream(d)
    it = iter(ds)
    next(it)
    if hasattr(ds, "skip"):
        try:
            ds.skip(3)
            next(it)
            return ds.state_dict(), True
        except AttributeError:  # the extension predates skip
            pass
    st = ds.state_dict()
    st["version"] = 2
    st["skips"] = [{"epoch": 0, "slot": [0, 1], "start": 10, "stop": 40}]
    return st, False


def test_state_with_skips(tmp_path, capsys, pi_data):
    st, real = _with_skips(pi_data)
    assert st["version"] >= 2 and st["skips"]
    f = tmp_path / "skips.json"
    f.write_text(json.dumps(st))
    rc, out, _ = main_rc(capsys, "state", str(f), "--json")
    d = json.loads(out)["states"][0]
    assert rc == 0 and d["version"] == st["version"]
    assert d["skips"] == st["skips"]
    assert d["skipped_rows"] == sum(r["stop"] - r["start"] for r in st["skips"]) == 30
    assert d["problems"] == []
    rc, out, _ = main_rc(capsys, "state", str(f))
    assert "skips        1 (30 rows): epoch 0 slot [0, 1] rows [10, 40)" in out
    if real:  # the library wrote these skips: the state must load over the same data
        rc, out, _ = main_rc(capsys, "state", str(f), "--source", pi_data)
        assert rc == 0, out


def test_state_version_1_is_refused_naming_the_version(tmp_path, capsys, pi_data):
    """Version 1 states (only ever written by development builds) are parsed by the core like
    any state and refused there, so the CLI says what the library would: unsupported version."""
    st = _state_after(pi_data, 2)
    st.pop("skips", None)
    st["version"] = 1
    st["fingerprint"] = {k: st["fingerprint"][k] for k in ("shards", "rows", "paths", "content")}
    d = describe_state(st)
    assert d["version"] is None and len(d["problems"]) == 1, d
    assert "version 1 is not supported" in d["problems"][0]
    f = tmp_path / "v1.json"
    f.write_text(json.dumps(st))
    rc, out, err = main_rc(capsys, "state", str(f), "--source", pi_data)
    assert rc == 2 and out == "" and "version 1 is not supported" in err, (rc, out, err)
    assert len(err.strip().splitlines()) == 1


def test_state_dcp_directory(tmp_path, pi_data):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    st = _state_after(pi_data, 4)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(
            {"shardstream/rank0": st},
            checkpoint_id=str(tmp_path / "dcp"),
            planner=DefaultSavePlanner(flatten_state_dict=False),
        )
    proc = run_cli("state", str(tmp_path / "dcp"), "--source", pi_data, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == "torch.distributed.checkpoint"
    assert out["states"][0]["emitted"] == 40 and out["all_match"] is True


class _Evil:
    """Pickled, it runs a shell command when unpickled by plain pickle."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_state_dcp_directory_runs_no_code_from_it(tmp_path, pi_data):
    """torch's DCP reader unpickles ``.metadata`` and non-tensor entries with plain pickle:
    ``shardstream state`` reads them without running code, and a damaged or hostile DCP
    directory is one line on stderr, exit 2 (a junk .metadata gave four tracebacks and exit
    1; a pickle in it ran)."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    marker = str(tmp_path / "ran")
    evil_meta = tmp_path / "evil_meta"
    evil_meta.mkdir()
    (evil_meta / ".metadata").write_bytes(pickle.dumps(_Evil(marker)))
    assert_clean_error(run_cli("state", str(evil_meta)), 2, "refusing to load")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / ".metadata").write_bytes(b"\x80\x04junk that is not a pickle")
    assert_clean_error(run_cli("state", str(junk)), 2, "not readable DCP metadata")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(
            {"shardstream/rank0": (_state_after(pi_data, 4),), "extra": (_Evil(marker),)},
            checkpoint_id=str(tmp_path / "evil_entry"),
        )
    assert_clean_error(run_cli("state", str(tmp_path / "evil_entry")), 2, "cannot read the DCP")
    assert not os.path.exists(marker)


def test_state_shows_a_map_style_samplers_state(tmp_path, capsys, pi_data):
    """A ``ResumableSampler`` state (alone, or beside a stream's in one checkpoint) is shown,
    checked as its sampler loads it (it was refused as a malformed state, exit 2); with
    ``--source`` it is bad input naming what checks it; a broken one is malformed."""
    from shardstream import ResumableSampler

    s = ResumableSampler(700, seed=1)
    it = iter(s)
    for _ in range(10):
        next(it)
    f = tmp_path / "ck.json"
    f.write_text(json.dumps({"sampler": s.state_dict(), "stream": _state_after(pi_data, 4)}))
    rc, out, err = main_rc(capsys, "state", str(f))
    assert rc == 0, err
    assert "2 shardstream state(s)" in out and "epoch 0, 10 of 700 positions (1.4%)" in out
    rc, out, _ = main_rc(capsys, "state", str(f), "--json")
    sampler = json.loads(out)["states"][0]
    assert (sampler["format"], sampler["position"], sampler["rows"]) == (
        "shardstream.Sampler", 10, 700,
    )  # fmt: skip
    rc, _, err = main_rc(capsys, "state", str(f), "--source", pi_data)
    assert rc == 2 and "map-style sampler's state" in err
    f.write_text(json.dumps(dict(s.state_dict(), position=701)))
    rc, _, err = main_rc(capsys, "state", str(f))
    assert rc == 2 and "is malformed" in err and "position" in err, err


def test_state_bad_input(tmp_path, capsys):
    missing = str(tmp_path / "nope.pt")
    assert_clean_error(run_cli("state", missing), 2, "shardstream state: error:", missing)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00\x01 definitely not a state")
    assert_clean_error(run_cli("state", str(garbage)), 2, "not a state file")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    rc, _, err = main_rc(capsys, "state", str(broken))
    assert rc == 2 and "not valid JSON" in err
    nostate = tmp_path / "other.json"
    nostate.write_text(json.dumps({"model": [1, 2, 3]}))
    rc, _, err = main_rc(capsys, "state", str(nostate))
    assert rc == 2 and "no shardstream state" in err
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(io.BytesIO(b"x")))  # a class: must not be imported/run
    rc, _, err = main_rc(capsys, "state", str(evil))
    assert rc == 2 and "refusing to load" in err
    trunc = tmp_path / "trunc.pt"
    buf = io.BytesIO()
    torch.save({"a": 1}, buf)
    trunc.write_bytes(buf.getvalue()[:40])
    rc, _, err = main_rc(capsys, "state", str(trunc))
    assert rc == 2 and "torch.load" in err
    rc, _, err = main_rc(capsys, "state", str(tmp_path))
    assert rc == 2 and "directory" in err


# --------------------------------------------------------------------------- untrusted files


class _Evil:
    """Unpickling this runs ``touch MARKER`` (what a planted checkpoint could do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def test_the_malicious_pickle_runs_code_when_unpickled(tmp_path):
    """The payload the refusal tests use really executes under plain pickle.load."""
    marker = tmp_path / "pwned"
    pickle.loads(pickle.dumps(_Evil(str(marker))))
    assert marker.exists()


@pytest.mark.parametrize("torch_installed", [True, False], ids=["torch", "no-torch"])
def test_checkpoint_loader_refuses_malicious_pickles(tmp_path, monkeypatch, torch_installed):
    """load_latest_checkpoint reads a planted pickle without running it and says so (rather
    than silently falling back to an older checkpoint), with and without torch."""
    from shardstream.checkpoint import checkpoint_path, load_latest_checkpoint, save_checkpoint

    if not torch_installed:
        monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    marker = tmp_path / "pwned"
    d = tmp_path / "ckpt"
    save_checkpoint({"step": 5}, d, 5)
    assert load_latest_checkpoint(d) == (5, {"step": 5}, checkpoint_path(d, 5))
    planted = checkpoint_path(d, 7)
    with open(planted, "wb") as f:
        pickle.dump({"model": _Evil(str(marker))}, f)
    with pytest.raises(
        pickle.UnpicklingError, match=r"ckpt-000000000007\.pt: refusing to load posix\.system"
    ):
        load_latest_checkpoint(d)
    assert not marker.exists()
    # The torch.save (zip) form of the same payload (this module's torch is the real one):
    # torch's weights_only loader refuses it; without torch it cannot be read at all.
    with open(planted, "wb") as f:
        f.write(_zip_torch({"model": _Evil(str(marker))}))
    if torch_installed:
        with pytest.raises(pickle.UnpicklingError, match="refusing to load posix.system"):
            load_latest_checkpoint(d)
    else:
        with pytest.raises(ImportError, match="ckpt-000000000007.pt: a torch.save file; .*torch"):
            load_latest_checkpoint(d)
    assert not marker.exists()
    # Damage is still skipped in favour of the previous checkpoint.
    with open(planted, "wb") as f:
        f.write(pickle.dumps({"step": 7})[:-3])
    assert load_latest_checkpoint(d)[:2] == (5, {"step": 5})


def test_without_torch_in_a_fresh_process(tmp_path, pi_data):
    """torch really absent (blocked before anything imports it): checkpoints round-trip as
    plain pickles, the planted one is refused by both the loader and the CLI."""
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"loader": _Evil(str(marker))}))
    state = tmp_path / "state.pt"
    state.write_bytes(pickle.dumps({"loader": _state_after(pi_data, 2)}))
    ck = str(tmp_path / "ck")
    script = f"""
import pickle, shutil, sys
sys.modules["torch"] = None  # as if torch were not installed: `import torch` fails
from shardstream.checkpoint import load_latest_checkpoint, save_checkpoint
from shardstream.cli import main

save_checkpoint({{"step": 3, "w": [1.5, None]}}, {ck!r}, 3)
print(load_latest_checkpoint({ck!r})[:2])
shutil.copy({str(evil)!r}, {ck!r} + "/ckpt-000000000009.pt")
try:
    load_latest_checkpoint({ck!r})
except pickle.UnpicklingError as e:
    print("refused:", e)
sys.stdout.flush()
rc = main(["state", {str(state)!r}, "--source", {pi_data!r}, "--json"])
print("state rc", rc, file=sys.stderr)
sys.exit(main(["state", {str(evil)!r}]))
"""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    assert lines[0] == "(3, {'step': 3, 'w': [1.5, None]})"
    assert lines[1].startswith("refused: ") and "refusing to load posix.system" in lines[1]
    assert json.loads("\n".join(lines[2:]))["all_match"] is True
    err = proc.stderr.splitlines()
    assert err[0] == "state rc 0"
    assert err[1].startswith(f"shardstream state: error: {evil}: refusing to load posix.system")
    assert len(err) == 2 and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_state_refuses_malicious_pickle(tmp_path, capsys):
    marker = tmp_path / "pwned"
    for name, data in (
        ("evil.pkl", pickle.dumps({"loader": _Evil(str(marker))})),
        ("evil.pt", _zip_torch({"loader": _Evil(str(marker))})),
        ("evil-legacy.pt", _legacy_torch({"loader": _Evil(str(marker))})),
    ):
        f = tmp_path / name
        f.write_bytes(data)
        rc, out, err = main_rc(capsys, "state", str(f))
        assert (rc, out) == (2, "") and not marker.exists(), (name, err)
        assert err.startswith(f"shardstream state: error: {f}: refusing to load posix.system")
        assert err.count("\n") == 1


def test_state_source_missing_is_bad_input(tmp_path, capsys, pi_data):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(_state_after(pi_data, 1)))
    missing = str(tmp_path / "no-data")
    rc, _, err = main_rc(capsys, "state", str(f), "--source", missing)
    assert rc == 2 and missing in err


def test_malformed_state_is_described_not_crashed(capsys):
    d = describe_state(
        {"format": "shardstream.ParquetStream", "version": 9, "position": 3, "skips": "x"}
    )
    # The core parses it as a load would and names the first thing wrong (the version).
    assert d["problems"] == [
        "state version 9 is not supported: this shardstream reads versions 2 and 3"
    ]
    assert d["percent"] is None


def _cut(st: dict, *path: str, keep: int, put: str = "") -> dict:
    """A copy of ``st`` with the string at ``path`` cut to ``keep`` characters, the last of them
    replaced by ``put`` if given."""
    st = copy.deepcopy(st)
    d = st
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = d[path[-1]][: keep - len(put)] + put
    return st


def _nested(inner: object, depth: int) -> object:
    for _ in range(depth):
        inner = [inner]
    return inner


def _deep_pickle(obj: object) -> bytes:
    """pickle.dumps of deeply nested data (the pickler recurses; the unpickler does not)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 20_000)
    try:
        return pickle.dumps(obj)
    finally:
        sys.setrecursionlimit(limit)


def _zip_torch(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _legacy_torch(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def _half(b: bytes) -> bytes:
    return b[: len(b) // 2]


def _bad_inputs(st: dict) -> dict:
    """name -> (file bytes or None for a directory, words the one-line error must hold)."""
    loop: list = []
    loop.append(loop)
    seed_deep = copy.deepcopy(st)
    seed_deep["settings"]["seed"] = _nested(0, 5000)
    emitted_str = copy.deepcopy(st)
    emitted_str["position"]["emitted"] = "12"
    no_slot = copy.deepcopy(st)
    no_slot["slot"] = None
    return {
        "deep JSON list": (b"[" * 5000 + b"]" * 5000, ["nested too deeply"]),
        "deep JSON dict": (b'{"a":' * 5000 + b"1" + b"}" * 5000, ["nested too deeply"]),
        "truncated torch.save": (_half(_zip_torch({"loader": st})), ["torch.load"]),
        "truncated legacy torch.save": (_half(_legacy_torch({"loader": st})), ["readable"]),
        "truncated pickle": (_half(pickle.dumps({"loader": st})), ["truncated"]),
        "truncated JSON": (_half(json.dumps({"loader": st}).encode()), ["not valid JSON"]),
        "directory": (None, ["is a directory"]),
        "empty file": (b"", ["empty file"]),
        "binary garbage": (bytes(range(256)) * 4, ["not a state file"]),
        "garbage after a pickle's first byte": (b"\x80" + bytes(range(255)), ["pickle"]),
        "garbage after a zip header": (b"PK\x03\x04" + bytes(range(200)), ["torch.load"]),
        "garbage after a brace": (b"{" + bytes(range(128, 256)), ["not valid JSON"]),
        "a list inside itself": (pickle.dumps(loop), ["no shardstream state"]),
        "state cut to its first keys": (
            json.dumps({"format": st["format"], "version": 2}).encode(),
            ["malformed", "missing field `fingerprint`"],
        ),
        "buffer with a character beyond Latin-1": (
            json.dumps(
                _cut(st, "position", "buffer", keep=len(st["position"]["buffer"]), put="\u0100")
            ),
            ["malformed", "state['position']['buffer'] holds the character", "not Latin-1 text"],
        ),
        "version-2 buffer that is not base64": (
            json.dumps(dict(st, version=2)),
            ["malformed", "state['position']['buffer'] is not valid base64"],
        ),
        "buffer cut (partial row id)": (
            json.dumps(_cut(st, "position", "buffer", keep=len(st["position"]["buffer"]) - 4)),
            ["malformed", "not a whole number of 8-byte row ids"],
        ),
        "position field of the wrong type": (
            json.dumps(emitted_str),
            ["malformed", "state['position']['emitted']", "expected u64"],
        ),
        "position without a slot": (json.dumps(no_slot), ["position but no slot"]),
        "a setting nested 5,000 deep": (_deep_pickle(seed_deep), ["nested deeper than"]),
    }


BAD_INPUTS = sorted(
    _bad_inputs(
        {
            "format": "x",
            "version": 2,
            "settings": {"seed": 0},
            "position": {"buffer": "", "emitted": 0},
        }
    )
)


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_state_bad_input_is_one_line_and_exit_2(name, tmp_path, capsys, pi_data):
    """Every unusable state file: one line on stderr naming the file, exit status 2, nothing on
    stdout, with and without --json (issue #13: deep JSON crashed, cut states exited 0)."""
    st = _state_after(pi_data, 3)
    assert st["position"]["buffer"], "the cut-buffer cases need buffered rows"
    content, needles = _bad_inputs(st)[name]
    path = tmp_path / "input"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    for extra in ([], ["--json"], ["--source", pi_data]):
        rc, out, err = main_rc(capsys, "state", str(path), *extra)
        assert (rc, out) == (2, ""), (name, extra, rc, out[:500], err[:500])
        assert err.startswith(f"shardstream state: error: {path}"), err[:500]
        assert err.count("\n") == 1 and len(err) < 1000, err[:2000]
        for n in needles:
            assert n in err, (n, err)


def test_state_deep_json_in_a_fresh_process(tmp_path):
    """What a user sees (issue #13: a traceback and exit status 1)."""
    f = tmp_path / "deep.json"
    f.write_text("[" * 5000 + "]" * 5000)
    proc = run_cli("state", str(f))
    assert_clean_error(proc, 2, str(f), "nested too deeply")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_state_deeply_nested_around_a_state_is_read(tmp_path, capsys, pi_data):
    st = _state_after(pi_data, 3)
    f = tmp_path / "deep.pkl"
    f.write_bytes(_deep_pickle({"loader": _nested(st, 5000)}))
    rc, out, err = main_rc(capsys, "state", str(f), "--source", pi_data, "--json")
    assert (rc, err) == (0, ""), err
    res = json.loads(out)
    assert [s["where"] for s in res["states"]] == ["['loader']" + "[0]" * 5000]
    assert res["all_match"] is True and res["states"][0]["emitted"] == st["position"]["emitted"]


def test_find_states_agrees_with_gather(pi_data):
    from shardstream.state import find_states, gather

    a, b = _state_after(pi_data, 1), _state_after(pi_data, 2)
    obj = {"a": [a, {"b": b}], "c": 3, (1, 2): (a,)}
    found = find_states(obj)
    assert found == [("['a'][0]", a), ("['a'][1]['b']", b), ("[(1, 2)][0]", a)]
    assert [s for _, s in found] == gather(obj)
    assert find_states(a) == [("", a)] and gather(a) == [a]
    assert find_states({"model": [1, 2.0, "x", None]}) == []


@pytest.mark.timeout(60)
def test_find_states_deep_cyclic_and_shared_objects(monkeypatch):
    """The one walker behind gather (load_state_dict) and the CLI: no recursion limit, no
    endless walk of a container inside itself, no exponential walk of shared references."""
    from shardstream import state
    from shardstream.errors import StateError
    from shardstream.state import find_states, gather

    # The cap's check, at a cap the bomb reaches in milliseconds (the real one, 2**20 states,
    # took ~20 s to reach: the walk is linear in the states found).
    monkeypatch.setattr(state, "MAX_STATES", 4096)
    MAX_STATES = state.MAX_STATES

    st = {"format": "shardstream.ParquetStream"}
    deep: object = st
    for _ in range(5000):
        deep = {"k": [deep]}
    assert find_states(deep) == [("['k'][0]" * 5000, st)]
    assert gather(deep) == [st]
    loop: list = [st]
    loop.append(loop)
    assert find_states(loop) == [("[0]", st)]
    assert find_states([st, st]) == [("[0]", st), ("[1]", st)]  # as load_state_dict sees it
    nothing: list = [0]
    for _ in range(200):  # 2**200 paths, one list per level
        nothing = [nothing, nothing]
    assert find_states(nothing) == []
    bomb: list = [st]
    for _ in range(MAX_STATES.bit_length()):
        bomb = [bomb, bomb]
    with pytest.raises(StateError, match="more than"):
        gather(bomb)


# --------------------------------------------------------------------------- progress, bench


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_tty():
    quiet = io.StringIO()
    with Progress(100, "work", stream=quiet) as bar:
        bar.update(60)
        bar.update(40)
    assert quiet.getvalue() == "" and bar.done == 100
    tty = _Tty()
    with Progress(100, "work", stream=tty, min_interval=0) as bar:
        bar.update(50)
        assert "work" in bar.line() and "50%" in bar.line() and "50/100 rows" in bar.line()
    text = tty.getvalue()
    assert text.startswith("\r") and "50%" in text and text.endswith("\r")  # erased at close
    with Progress(None, "count", stream=_Tty(), unit="shards") as bar:
        bar.update(3)
        assert "3 shards" in bar.line()


def test_bench_quick_table_and_json(capsys):
    proc = run_cli("bench", "--rows", "8000", "--shards", "2", "--repeat", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # stderr is a pipe: no progress bar
    res = json.loads(proc.stdout)
    assert res["rows"] == 8000 and res["iterate"]["shardstream_rows_s"] > 0
    assert res["iterate"]["pyarrow_rows_s"] > 0
    assert [r["at"] for r in res["resume"]] == [0.5, 0.9]
    assert all(r["shardstream_s"] > 0 and r["pyarrow_skip_s"] > 0 for r in res["resume"])
    rc, out, err = main_rc(capsys, "bench", "--rows", "4000", "--shards", "2", "--repeat", "1")
    assert rc == 0 and err == ""
    for needle in ("benchmark", "shardstream", "pyarrow", "iterate", "resume at 50%", "state_dict"):
        assert needle in out
    rc, _, err = main_rc(capsys, "bench", "--rows", "3", "--shards", "4")
    assert rc == 2 and "--shards" in err


def test_demo_runs_via_the_cli(tmp_path):
    proc = run_cli(
        "demo", "--rows", "6000", "--shards", "3", "--shuffle-buffer", "500", "--dir",
        str(tmp_path), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "OK: exact resume verified" in proc.stdout
    assert "\r" not in proc.stderr  # no progress bar when stderr is not a terminal


# --------------------------------------------------------------------------- argument ranges


BAD_NUMBERS = [
    # (argv, the argument the error names)
    (["demo", "--rows", "0"], "--rows"),
    (["demo", "--rows", "-5"], "--rows"),
    (["demo", "--rows", "10000000000000"], "--rows"),
    (["demo", "--shards", "0"], "--shards"),
    (["demo", "--shards", "-1"], "--shards"),
    (["demo", "--shards", "1000000000"], "--shards"),
    (["demo", "--batch-size", "0"], "--batch-size"),
    (["demo", "--shuffle-buffer", "-1"], "--shuffle-buffer"),
    (["demo", "--shuffle-buffer", str(2**32)], "--shuffle-buffer"),
    (["demo", "--seed", "-1"], "--seed"),
    (["demo", "--seed", str(2**64)], "--seed"),
    (["demo", "--workers", "-1"], "--workers"),
    (["demo", "--workers", "100000"], "--workers"),
    (["bench", "--rows", "0"], "--rows"),
    (["bench", "--rows", "10000000000000"], "--rows"),
    (["bench", "--shards", "0"], "--shards"),
    (["bench", "--shards", "1000000000"], "--shards"),
    (["bench", "--batch-size", "0"], "--batch-size"),
    (["bench", "--batch-size", "99999999999999999999"], "--batch-size"),
    (["bench", "--shuffle-buffer", "-1"], "--shuffle-buffer"),
    (["bench", "--shuffle-buffer", "5000000000"], "--shuffle-buffer"),
    (["bench", "--repeat", "0"], "--repeat"),
]


@pytest.mark.parametrize("argv,name", BAD_NUMBERS, ids=[" ".join(a) for a, _ in BAD_NUMBERS])
def test_numeric_arguments_out_of_range_are_refused_at_parsing(argv, name, capsys):
    """Refused by the parser (nothing is generated, no worker starts), naming the argument and
    the range: ``demo --rows 0`` was a traceback from the resume child (exit 1); a huge
    ``--shards`` or ``--workers`` would allocate or fork in proportion."""
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"shardstream {argv[0]}: error: argument {name}: expected"), err


BAD_STOP_AT = ["1.5", "-1", "0", "1", "nan", "inf"]


@pytest.mark.parametrize("value", BAD_STOP_AT)
def test_demo_stop_at_is_a_fraction_strictly_inside_the_epoch(value, capsys):
    """``--stop-at F`` interrupts after fraction F of the epoch's batches: 1.5 and -1 were
    accepted and silently clamped to the last / first batch (inf was a traceback)."""
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["demo", "--stop-at", value])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --stop-at: expected a fraction" in err and value in err, err
    ok = cli.build_parser().parse_args(["demo", "--stop-at", "0.25", "--rows", "1000"])
    assert ok.stop_at == 0.25 and ok.rows == 1000


def test_demo_and_bench_need_two_batches(capsys):
    """Too few rows for an interrupt inside the epoch: one line naming the arguments, exit 2,
    before any data is written (``demo --rows 0`` was a traceback from the child process;
    ``bench`` with ``--rows <= --batch-size`` a RuntimeError traceback)."""
    proc = run_cli("demo", "--rows", "0")
    assert_clean_error(proc, 2, "shardstream demo: error: argument --rows")
    for cmd in ("demo", "bench"):
        rc, out, err = main_rc(capsys, cmd, "--rows", "300", "--batch-size", "300", "--shards", "2")
        assert rc == 2 and out == "", (rc, out, err)
        assert err.startswith(f"shardstream {cmd}: error: ") and "--batch-size" in err, err
        assert len(err.strip().splitlines()) == 1
    rc, _, err = main_rc(capsys, "demo", "--rows", "5", "--shards", "8", "--batch-size", "2")
    assert rc == 2 and "--shards" in err, err


# --------------------------------------------------------------------------- special files


def _dcp_dir(path, state: dict) -> str:
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: single process"
        dcp.save(
            {"shardstream/rank0": state},
            checkpoint_id=str(path),
            planner=DefaultSavePlanner(flatten_state_dict=False),
        )
    return str(path)


FIFO_CASES = [
    "state-file",
    "state-dcp-metadata",
    "state-dcp-data",
    "state-source",
    "inspect-file",
    "inspect-dir",
    "inspect-glob",
    "inspect-file-url",
    "inspect-sidecar",
    "index-file",
]


@pytest.mark.parametrize("case", FIFO_CASES)
def test_named_pipes_are_refused_not_read(case, tmp_path, pi_data):
    """A FIFO (or socket, device) where a file is read is one line naming it, exit 2: opening
    a FIFO waits for a writer, so ``state FIFO`` and ``inspect FIFO`` hung forever. Run with a
    timeout: a regression fails instead of hanging."""
    fifo = str(tmp_path / "pipe.parquet")
    os.mkfifo(fifo)
    state = tmp_path / "state.json"
    state.write_text(json.dumps(_state_after(pi_data, 2)))
    data = tmp_path / "data"
    shutil.copytree(pi_data, data)
    if case == "state-file":
        argv, named = ["state", fifo], fifo
    elif case in ("state-dcp-metadata", "state-dcp-data"):
        d = _dcp_dir(tmp_path / "dcp", _state_after(pi_data, 2))
        victim = os.path.join(d, ".metadata")
        if case == "state-dcp-data":
            (victim,) = (os.path.join(d, n) for n in os.listdir(d) if n.endswith(".distcp"))
        os.remove(victim)
        os.mkfifo(victim)
        argv, named = ["state", d], victim
    elif case == "state-source":
        argv, named = ["state", str(state), "--source", fifo], fifo
    elif case == "inspect-file":
        argv, named = ["inspect", fifo], fifo
    elif case == "inspect-dir":
        os.mkfifo(data / "zz.parquet")
        argv, named = ["inspect", str(data)], str(data / "zz.parquet")
    elif case == "inspect-glob":
        os.mkfifo(data / "zz.parquet")
        argv, named = ["inspect", str(data / "*.parquet")], str(data / "zz.parquet")
    elif case == "inspect-file-url":
        argv, named = ["inspect", "file://" + fifo], "file://" + fifo
    elif case == "inspect-sidecar":
        os.mkfifo(data / "_shardstream_index.json")
        argv, named = ["inspect", str(data)], str(data / "_shardstream_index.json")
    else:
        argv, named = ["index", fifo], fifo
    proc = run_cli(*argv, timeout=30)
    assert_clean_error(proc, 2, f"shardstream {argv[0]}: error: {named}: ", "named pipe")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_devices_are_refused_and_directories_still_read(tmp_path, capsys, pi_data):
    rc, _, err = main_rc(capsys, "state", os.devnull)
    assert rc == 2 and f"{os.devnull}: not a regular file (a character device)" in err, err
    d = _dcp_dir(tmp_path / "dcp", _state_after(pi_data, 4))
    rc, out, err = main_rc(capsys, "state", d, "--source", pi_data, "--json")
    assert rc == 0, err
    assert json.loads(out)["states"][0]["emitted"] == 40
    rc, out, err = main_rc(capsys, "inspect", pi_data, "--json")
    assert rc == 0 and json.loads(out)["totals"]["rows"] == 800, err
