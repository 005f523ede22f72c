"""The command line: ``python -m shardstream inspect|state|demo|bench`` and ``cli.main``.

Subprocess runs check what a user sees (exit status, stdout, stderr without tracebacks);
in-process ``cli.main([...])`` runs cover the rest cheaply. ``inspect --json`` is compared with
pyarrow's own reading of the footers; ``state`` reads states made by the real API.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import shardstream
import torch
from shardstream import ParquetStream, cli, datagen
from shardstream._progress import Progress

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
    monkeypatch.setattr(cli, "SLOW_ROW_GROUP_ROWS", 100)
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
        assert got["buffer_rows"] == len(base64.b64decode(pos["buffer"])) // 8 > 0
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


def test_state_version_1_is_shown(tmp_path, capsys, pi_data):
    """Older states (version 1: no ``skips``, fewer fingerprint keys) are still readable."""
    st = _state_after(pi_data, 2)
    st.pop("skips", None)
    st["version"] = 1
    st["fingerprint"] = {k: st["fingerprint"][k] for k in ("shards", "rows", "paths", "content")}
    d = cli.describe_state(st)
    assert d["version"] == 1 and d["skips"] == [] and d["skipped_rows"] == 0
    assert d["problems"] == [] and d["emitted"] == 20
    f = tmp_path / "v1.json"
    f.write_text(json.dumps(st))
    rc, out, err = main_rc(capsys, "state", str(f), "--source", pi_data)
    assert "version 1" in out and "not recorded" in out
    assert rc in (0, 1) and err == ""  # whether this library still loads v1 is its business
    if rc == 1:
        assert "DOES NOT MATCH" in out


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


def test_state_source_missing_is_bad_input(tmp_path, capsys, pi_data):
    f = tmp_path / "s.json"
    f.write_text(json.dumps(_state_after(pi_data, 1)))
    missing = str(tmp_path / "no-data")
    rc, _, err = main_rc(capsys, "state", str(f), "--source", missing)
    assert rc == 2 and missing in err


def test_malformed_state_is_described_not_crashed(capsys):
    d = cli.describe_state(
        {"format": "shardstream.ParquetStream", "version": 9, "position": 3, "skips": "x"}
    )
    assert len(d["problems"]) == 3 and d["percent"] is None


def test_find_states_agrees_with_gather(pi_data):
    from shardstream.state import gather

    obj = {"a": [_state_after(pi_data, 1), {"b": _state_after(pi_data, 2)}], "c": 3}
    found = cli.find_states(obj)
    assert [w for w, _ in found] == ["['a'][0]", "['a'][1]['b']"]
    assert [s for _, s in found] == gather(obj)


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
    rc, _, err = main_rc(capsys, "bench", "--rows", "1", "--shards", "2")
    assert rc == 2 and "--shards" in err


def test_demo_runs_via_the_cli(tmp_path):
    proc = run_cli(
        "demo", "--rows", "6000", "--shards", "3", "--shuffle-buffer", "500", "--dir",
        str(tmp_path), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "OK: exact resume verified" in proc.stdout
    assert "\r" not in proc.stderr  # no progress bar when stderr is not a terminal
