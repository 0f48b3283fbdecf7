"""The bad-input battery across every command that reads a user file: non-finite numbers, absurd
counts, keys given twice, the wrong nesting, files that are not text (compressed, binary, a folder,
missing, unreadable) and malformed --set values. Each is one line naming the file (or option) and the
key, exit code 2, no traceback, and no output written (--out, a sweep's folder, a report's HTML).
Other files of the battery (test_inputs_*.py, test_bad_input_*.py) cover each kind of file in depth;
this one holds the cases that failed when it was first run, and one of each class per command."""

from __future__ import annotations

import bz2
import copy
import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import yaml

from tests.inputs_support import GPU, LLAMA2_7B, SCENARIO, changed, invoke, refused, write_json, write_yaml

REPO = Path(__file__).resolve().parents[1]
H200_SCENARIO = REPO / "examples" / "h200-bert-large-one-gpu.yaml"


def _shipped(package: str, *parts: str) -> dict:
    return json.loads(resources.files(package).joinpath(*parts).read_text())


PROFILE = _shipped("clustersim.calibration", "profiles", "h200-pytorch-2.11.json")
RAW = _shipped("clustersim.validation", "testbed", "gloo-8hosts-200mbit.json")
STORED_RUN = _shipped("clustersim.validation", "testbed", "mlp-zero3-200mbit-1.json")


def _set(data: dict, dotted: str, value) -> dict:
    """A deep copy of ``data`` with the value at ``dotted`` (list items by index) set."""
    data = copy.deepcopy(data)
    node = data
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[int(parts[-1]) if isinstance(node, list) else parts[-1]] = value
    return data


def _with_token(data: dict, dotted: str, token: str, dump=json.dumps) -> str:
    """``data`` serialised with the value at ``dotted`` replaced by the raw text ``token`` (JSON's NaN
    or Infinity, YAML's .inf), which no serialiser writes on purpose."""
    text = dump(_set(data, dotted, "XTOKENX"))
    for quoted in ('"XTOKENX"', "'XTOKENX'", "XTOKENX"):
        text = text.replace(quoted, token)
    return text


# ---- non-finite numbers: YAML's .inf/-.inf/.nan, JSON's Infinity/NaN, for rates, counts, sizes and
# efficiencies, in every command that reads a scenario
NON_FINITE_KEYS = [
    "cluster.nic.line_rate_gbps",  # a rate
    "cluster.nodes",  # a count
    "workload.micro_batch",  # a size
    "cluster.intra_node.measured_allreduce_busbw_gbs",  # a measured efficiency of the fabric
]
SCENARIO_COMMANDS = {
    "run": ("run", "{f}", "--samples", "0"),
    "compare": ("compare", "{f}", "--samples", "0", "--gpus", "8", "--optimizers", "adam"),
    "collective": ("collective", "{f}"),
}


@pytest.mark.parametrize("command", sorted(SCENARIO_COMMANDS))
@pytest.mark.parametrize("token", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", NON_FINITE_KEYS)
def test_yaml_non_finite_numbers_are_refused_by_key(tmp_path, command, token, key):
    path = tmp_path / "s.yaml"
    path.write_text(_with_token(SCENARIO, key, token, lambda d: yaml.safe_dump(d, sort_keys=False)))
    args = [a.format(f=path) for a in SCENARIO_COMMANDS[command]]
    refused(invoke(*args), str(path), key)


@pytest.mark.parametrize("token", ["Infinity", "-Infinity", "NaN"])
@pytest.mark.parametrize("key", NON_FINITE_KEYS)
def test_json_non_finite_numbers_are_refused_by_key(tmp_path, token, key):
    path = tmp_path / "s.json"
    path.write_text(_with_token(SCENARIO, key, token))
    refused(invoke("run", path, "--samples", "0"), str(path), key)


@pytest.mark.parametrize(
    "kind,key",
    [
        ("profile", "memory_gbs"),
        ("profile", "dispatch.host_s_per_kernel_forward"),
        ("raw", "collectives.0.median_s"),
        # a key no fit reads, kept in the profile written from the file: it named the --out file
        ("raw", "collectives.0.ranks"),
        ("raw", "collectives.0.repeats"),
        # kept whole and written back by --out: NaN there named the --out file, after seconds of work
        ("stored", "params"),
        ("stored", "provenance.cores"),
    ],
)
def test_json_non_finite_numbers_in_measurement_files_name_the_input(tmp_path, kind, key):
    out = tmp_path / "out.json"
    path = tmp_path / f"{kind}.json"
    if kind == "profile":
        path.write_text(_with_token(PROFILE, key, "NaN"))
        r = invoke("run", H200_SCENARIO, "--samples", "0", "--profile", path)
    elif kind == "raw":
        path.write_text(_with_token(RAW, key, "Infinity"))
        r = invoke("calibrate", "fit", path, "--out", out)
    else:
        path.write_text(_with_token(STORED_RUN, key, "NaN"))
        r = invoke("testbed", "repredict", path, "--samples", "0", "--out", out)
    refused(r, str(path), key)
    assert not out.exists()


# ---- absurd counts: refused in a fraction of a second, naming the limit's source, or simulated quickly
ABSURD = [
    ("cluster.nodes", 10**9, "beyond any real machine"),
    ("cluster.gpus_per_node", 10**6, "nvlink_domain_gpus"),
    ("workload.micro_batch", 10**12, "does not fit in GPU memory"),
    ("cluster.nodes", 2.5, "not a whole number: 2.5"),
    ("cluster.nodes", True, "not a whole number: true"),
    ("workload.micro_batch", False, "not a whole number: false"),
    ("cluster.nic.line_rate_gbps", True, "not true/false"),
    ("cluster.nic.count", 10**6, "NICs per node"),
    # a host-bound eager step lists every micro-step: 1e9 of them are refused before any is built
    ("workload.gradient_accumulation", 10**9, "would list more than"),
]


@pytest.mark.parametrize("key,value,words", ABSURD, ids=[f"{k}={v!r}" for k, v, _ in ABSURD])
def test_absurd_counts_are_refused_by_key(tmp_path, key, value, words):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, key, value))
    refused(invoke("run", path, "--samples", "0"), path, key, words)


def test_too_many_micro_steps_are_refused_before_their_ops_are_built(tmp_path, monkeypatch):
    """A global batch of 1e15 split over 8 GPUs is 1.6e13 micro-steps of a host-bound step: the program
    used to be built to its 400,000-op budget before the refusal (2-4 s per cell; `plan --global-batch
    1e15` tried 1,728 candidates for over half an hour). It is refused now before they are built."""
    from clustersim.simulator.program import Program

    built = [0]
    add_op = Program.add_op

    def counting(self, *args):
        built[0] += 1
        return add_op(self, *args)

    monkeypatch.setattr(Program, "add_op", counting)
    path = write_yaml(tmp_path / "s.yaml", SCENARIO)
    r = invoke(
        "compare", path, "--samples", "0", "--gpus", "8", "--optimizers", "adam", "--global-batch", 10**15
    )
    refused(r, path, "would list more than 400,000 ops")
    assert built[0] < 10_000, built[0]


# ---- a key given twice: YAML and JSON, in every kind of file (the second silently won before the
# reader refused it; these keep it so)
def _twice(text: str, key: str, quote: str = '"') -> str:
    """``text`` (JSON) with ``key`` given once more before its first place, with the value 1."""
    first = f"{quote}{key}{quote}: "
    return text.replace(first, f"{first}1, {first}", 1)


_PLAN = ("plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d")
_SWEEP_TWICE = "name: a\nbase: preset:default\nvary: {nic_gbps: [10]}\nvary: {gpus: [8]}\n"
# (file name, its text, command line with {f} for it and {tmp} for the folder, the key given twice)
DUPLICATES = {
    "scenario": (
        "s.yaml",
        lambda: yaml.safe_dump(SCENARIO, sort_keys=False).replace("  nodes: 2\n", "  nodes: 2\n  nodes: 4\n"),
        ("run", "{f}", "--samples", "0"),
        "nodes",
    ),
    "scenario-json": ("s.json", lambda: _twice(json.dumps(SCENARIO), "nodes"), ("run", "{f}"), "nodes"),
    "sweep": ("sw.yaml", lambda: _SWEEP_TWICE, ("sweep", "{f}", "--out", "{tmp}/out"), "vary"),
    "catalog": (
        "c.yaml",
        lambda: yaml.safe_dump({"MyGPU": GPU}).replace("hbm_gbs: 2039", "hbm_gbs: 2039\n  hbm_gbs: 1"),
        ("hardware", "list", "--catalog", "{f}"),
        "hbm_gbs",
    ),
    "profile": (
        "p.json",
        lambda: _twice(json.dumps(PROFILE), "memory_gbs"),
        ("calibrate", "show", "{f}"),
        "memory_gbs",
    ),
    "raw": (
        "r.json",
        lambda: _twice(json.dumps(RAW), "device"),
        ("calibrate", "fit", "{f}", "--out", "{tmp}/p.json"),
        "device",
    ),
    "stored": (
        "t.json",
        lambda: _twice(json.dumps(STORED_RUN), "rate"),
        ("testbed", "repredict", "{f}", "--out", "{tmp}/p.json"),
        "rate",
    ),
    "hf-config": (
        "config.json",
        lambda: _twice(json.dumps(LLAMA2_7B), "hidden_size"),
        ("models", "import", "{f}", "--out", "{tmp}/m.yaml"),
        "hidden_size",
    ),
    "have": ("h.yaml", lambda: "cluster:\n  nodes: 2\n  nodes: 4\n", (*_PLAN, "--have", "{f}"), "nodes"),
}


@pytest.mark.parametrize("kind", sorted(DUPLICATES))
def test_a_key_given_twice_is_refused(tmp_path, kind):
    name, text, args, key = DUPLICATES[kind]
    path = tmp_path / name
    path.write_text(text())
    refused(invoke(*(a.format(f=path, tmp=tmp_path) for a in args)), str(path), f"'{key}' given twice")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no --out, no results folder


# ---- the wrong nesting and documents that hold nothing
SHAPES = {
    "list": "- a\n- b\n",
    "scalar": "42\n",
    "empty": "",
    "comments": "# nothing here\n# nor here\n",
}
SHAPED = {
    "scenario": ("run", "{f}", "--samples", "0"),
    "sweep": ("sweep", "{f}", "--out", "{tmp}/out"),
    "catalog": ("run", "preset:default", "--samples", "0", "--catalog", "{f}"),
    "have": ("plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--have", "{f}"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("kind", sorted(SHAPED))
def test_a_document_of_the_wrong_shape_is_refused(tmp_path, kind, shape):
    """An empty --catalog file (or one of comments only) added nothing without a word: the wrong file
    given, most likely; it is refused as every other empty input is."""
    path = tmp_path / "input.yaml"
    path.write_text(SHAPES[shape])
    refused(invoke(*(a.format(f=path, tmp=tmp_path) for a in SHAPED[kind])), str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.yaml"]


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("cluster", [1, 2], "expected a section of keys (a mapping), not a list"),
        ("cluster.nic", [{"kind": "infiniband"}], "cluster.nic: expected a section of keys"),
        ("workload", "BERT", "workload: expected a section of keys"),
        ("workload.layers", {"a": 1}, "workload.layers: Input should be a valid list"),
        ("cluster.gpu", 100, "cluster.gpu: expected a GPU name"),
        ("cluster.gpu", "Z9000", "cluster.gpu: unknown GPU 'Z9000'"),
    ],
)
def test_a_section_of_the_wrong_kind_is_refused_by_key(tmp_path, key, value, words):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, key, value))
    refused(invoke("run", path, "--samples", "0"), path, words)


# ---- files that are not text, or not there: every structured input goes through one reader
ENTRY = {
    "scenario": (".yaml", ("run", "{f}", "--samples", "0")),
    "catalog": (".yaml", ("hardware", "list", "--catalog", "{f}")),
    "profile": (".json", ("calibrate", "show", "{f}")),
    "sweep": (".yaml", ("sweep", "{f}", "--out", "{tmp}/out")),
    "raw": (".json", ("calibrate", "fit", "{f}", "--out", "{tmp}/p.json")),
    "stored": (".json", ("testbed", "repredict", "{f}", "--out", "{tmp}/p.json")),
    "hf-config": (".json", ("models", "import", "{f}", "--out", "{tmp}/m.yaml")),
    "have": (
        ".yaml",
        ("plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--have", "{f}"),
    ),
}


def _zip(text: bytes) -> bytes:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("input", text)
    return buf.getvalue()


COMPRESSED = {
    "gzip": (gzip.compress, "is gzip-compressed"),
    "bzip2": (bz2.compress, "is bzip2-compressed"),
    "zip": (_zip, "is zip-compressed"),
}


@pytest.mark.parametrize("packer", sorted(COMPRESSED))
@pytest.mark.parametrize("kind", sorted(ENTRY))
def test_a_compressed_file_under_a_plain_name_says_so(tmp_path, kind, packer):
    """It read "not UTF-8 text (an invalid byte on line 1)", which sent the user looking for a bad byte."""
    pack, words = COMPRESSED[packer]
    suffix, args = ENTRY[kind]
    path = tmp_path / f"input{suffix}"
    path.write_bytes(pack(yaml.safe_dump(SCENARIO).encode() * 3))
    refused(invoke(*(a.format(f=path, tmp=tmp_path) for a in args)), str(path), words)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


FILES = {
    "not-utf8": (lambda p: p.write_bytes(b"name: caf\xe9\n"), "not UTF-8"),
    "binary": (lambda p: p.write_bytes(bytes(range(256)) * 4), "not UTF-8"),
    "utf16": (lambda p: p.write_bytes("name: x\n".encode("utf-16")), "not UTF-8"),
    "folder": (lambda p: p.mkdir(), "folder"),
    "missing": (lambda p: None, "not found"),
}


@pytest.mark.parametrize("bad", sorted(FILES))
@pytest.mark.parametrize("kind", sorted(ENTRY))
def test_a_file_that_is_not_text_is_refused(tmp_path, kind, bad):
    make, words = FILES[bad]
    suffix, args = ENTRY[kind]
    path = tmp_path / f"input{suffix}"
    make(path)
    r = invoke(*(a.format(f=path, tmp=tmp_path) for a in args))
    # typer checks --catalog and --have exist before the reader (its own one line, naming the option)
    out = refused(r, str(path))
    assert words in out or "does not exist" in out or "is a directory" in out, out


def _unreadable_invoke(*args):
    """The command as a user who may not read what was made unreadable: in-process when this is not
    root, else a subprocess of root without the capabilities that let root read any file (setpriv),
    else None (the test is skipped)."""
    if os.geteuid() != 0:
        return invoke(*args)
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cmd = [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}", sys.executable, "-m", "clustersim"]
    proc = subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
    if "Operation not permitted" in proc.stderr and "setpriv" in proc.stderr:
        return None  # a container that may not drop capabilities

    class Result:  # what refused() reads of a CliRunner result
        exit_code = proc.returncode
        output = proc.stdout + proc.stderr
        exception = None

    return Result()


@pytest.fixture(scope="module")
def results_folder(tmp_path_factory):
    from tests.conftest import swept_results

    spec = {"name": "battery", "base": SCENARIO, "vary": {"nic_gbps": [100, 200]}, "samples": 0}
    return swept_results(tmp_path_factory, "battery", spec)


@pytest.mark.parametrize("case", ["scenario", "profile", "results.csv", "scenarios.jsonl", "output folder"])
def test_an_unreadable_file_is_one_line(tmp_path, results_folder, case):
    """chmod 000: a report on an unreadable results.csv, or an output under a folder that may not be
    searched, ended in PermissionError tracebacks."""
    folder = tmp_path / "work"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o777)
    if case in ("scenario", "profile"):
        path = folder / ("s.yaml" if case == "scenario" else "p.json")
        path.write_text(yaml.safe_dump(SCENARIO) if case == "scenario" else json.dumps(PROFILE))
        args = (
            ("run", H200_SCENARIO, "--samples", "0", "--profile", path)
            if case == "profile"
            else ("run", path, "--samples", "0")
        )
        named = path
    elif case == "output folder":
        closed = folder / "closed"
        closed.mkdir()
        named = closed / "trace.json"
        args = ("run", "preset:default", "--samples", "0", "--trace", named)
        path = closed
    else:
        res = folder / "res"
        shutil.copytree(results_folder, res)
        os.chmod(res, 0o755)
        for p in res.iterdir():
            os.chmod(p, 0o644)
        path = named = res / case
        args = ("report", res, "--out", folder / "r.html", "--samples", "0")
    os.chmod(path, 0)
    try:
        r = _unreadable_invoke(*args)
    finally:
        os.chmod(path, 0o755)
    if r is None:
        pytest.skip("running as root, and no setpriv to drop the capability to read any file")
    refused(r, str(named), "Permission denied")
    assert not (folder / "r.html").exists()


# ---- --set with malformed values
SETS = [
    ("cluster.nodes=[1", "cluster.nodes", "not a YAML value"),
    ("cluster.nodes='x", "cluster.nodes", "not a YAML value"),
    ("cluster.nodes={a: 1, a: 2}", "cluster.nodes", "given twice"),
    ("cluster.nodes", "cluster.nodes", "not KEY=VALUE"),
    ("=3", "=3", "not KEY=VALUE"),
    ("cluster.nopekey=3", "cluster.nopekey", "unknown key"),
    ("nonexistent.key=3", "nonexistent", "unknown key"),
    ("workload.layers.0.params=3", "workload.layers.0.params", "not a list's items"),
    ("cluster.nodes.0=3", "cluster.nodes.0", "not a list's items"),
    ("cluster.nic.line_rate_gbps=.inf", "cluster.nic.line_rate_gbps", "not a plain decimal number"),
    ("cluster.nic.line_rate_gbps=-.inf", "cluster.nic.line_rate_gbps", "not a plain decimal number"),
    ("cluster.nodes=.nan", "cluster.nodes", "not a plain decimal number"),
    ("cluster.nic.line_rate_gbps=Infinity", "cluster.nic.line_rate_gbps", "not the text 'Infinity'"),
    ("cluster.nodes=1e9", "cluster.nodes", "beyond any real machine"),
    ("cluster.nodes=2.5", "cluster.nodes", "not a whole number"),
    ("cluster.nodes=true", "cluster.nodes", "not a whole number: true"),
    ("cluster=3", "cluster", "expected a section of keys"),
    ("cluster.nic=[1, 2]", "cluster.nic", "expected a section of keys"),
    ("cluster.gpu=Z9000", "cluster.gpu", "unknown GPU"),
]


@pytest.mark.parametrize("setting,key,words", SETS, ids=[s for s, _, _ in SETS])
def test_a_malformed_set_is_refused(tmp_path, setting, key, words):
    path = write_yaml(tmp_path / "s.yaml", SCENARIO)
    refused(invoke("run", path, "--samples", "0", "--set", setting), "--set", key, words)


# ---- what the battery found: each a traceback, a silent acceptance, or an error naming the wrong file
def _damaged_results(results_folder: Path, tmp_path: Path, column: str, value: str) -> Path:
    folder = tmp_path / "res"
    shutil.copytree(results_folder, folder)
    rows = list(csv.reader((folder / "results.csv").read_text().splitlines()))
    i = rows[0].index(column)
    for row in rows[1:]:
        row[i] = value
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (folder / "results.csv").write_text(buf.getvalue())
    return folder


@pytest.mark.parametrize(
    "column,value,words",
    [
        ("nic_gbps", "fast", "nic_gbps 'fast' is not a number"),  # an axis, and a metric: a ValueError
        ("world_size", "", "world_size is empty in a row that ran"),  # a TypeError
        ("world_size", "2.5", "world_size is 2.5, not a positive whole number"),
        ("nodes", "0", "nodes is 0, not a positive whole number"),
        ("iteration_time_s", "0", "iteration_time_s is 0, not a positive number"),  # ZeroDivisionError
        ("iteration_time_s", "NaN", "not a finite number"),
        ("samples_per_s", "", "samples_per_s is empty"),
        ("gpu", "", "gpu is empty"),  # an AttributeError
    ],
)
def test_a_damaged_results_csv_is_one_line_and_no_report(tmp_path, results_folder, column, value, words):
    folder = _damaged_results(results_folder, tmp_path, column, value)
    html = tmp_path / "r.html"
    refused(invoke("report", folder, "--out", html, "--samples", "0"), str(folder / "results.csv"), words)
    assert not html.exists()


def test_compare_names_a_bad_profile_and_its_key(tmp_path):
    """It said "no optimizer at any GPU count could be simulated: Input should be a finite number",
    naming the scenario: every cell had failed on the profile, without the profile's name or key."""
    path = tmp_path / "p.json"
    path.write_text(_with_token(PROFILE, "memory_gbs", "Infinity"))
    args = ["compare", H200_SCENARIO, "--samples", "0", "--gpus", "1", "--optimizers", "adam"]
    refused(invoke(*args, "--profile", path), str(path), "memory_gbs", "finite")
    refused(invoke(*args, "--profile", path, "--json"), str(path), "memory_gbs", "finite")


@pytest.mark.parametrize(
    "key,value,words",
    [  # true read as 1 and 1e308 s as a time: plain float and int fields of the profile's schema
        ("dispatch.host_s_per_kernel_forward", True, "not true/false"),
        ("dispatch.host_s_per_kernel_forward", 1e308, "beyond any measured step"),
        ("dispatch.device_s_per_kernel", True, "not true/false"),
        ("model_compute.0.micro_batches.0", True, "not a whole number: true"),
        ("model_compute.0.forward.kernels", 2.5, "not a whole number"),
        ("host.cpu_adam_params_per_s.1", 1e308, "beyond any host"),
    ],
)
def test_a_profile_value_of_the_wrong_kind_is_refused(tmp_path, key, value, words):
    path = write_json(tmp_path / "p.json", _set(PROFILE, key, value))
    refused(invoke("run", H200_SCENARIO, "--samples", "0", "--profile", path), path, key, words)


@pytest.mark.parametrize(
    "value,words",
    [(10**9, "1000000000 ranks, but 8 nodes x 1 GPUs per node are 8"), (2.5, "not a whole number"),
     (True, "not a whole number: true")],
)  # fmt: skip
def test_a_raw_collective_whose_ranks_disagree_is_refused(tmp_path, value, words):
    """``ranks`` was read by nothing and kept in the profile: 1e9 or true were fitted without a word."""
    path = write_json(tmp_path / "raw.json", _set(RAW, "collectives.0.ranks", value))
    out = tmp_path / "p.json"
    refused(invoke("calibrate", "fit", path, "--out", out), path, "collectives.0.ranks", words)
    assert not out.exists()


@pytest.mark.parametrize("key,value", [("params", []), ("params", True), ("label", 3), ("batch", 0)])
def test_a_stored_run_with_a_damaged_title_is_refused_before_predicting(tmp_path, key, value):
    """``params: []`` ended the table in a TypeError after seconds of prediction."""
    path = write_json(tmp_path / "run.json", _set(STORED_RUN, key, value))
    out = tmp_path / "out.json"
    refused(invoke("testbed", "repredict", path, "--samples", "0", "--out", out), path, key)
    assert not out.exists()


def test_an_empty_catalog_in_a_sweep_is_refused(tmp_path):
    (tmp_path / "empty.yaml").write_text("# no entries yet\n")
    spec = {
        "name": "s",
        "base": copy.deepcopy(SCENARIO),
        "catalog": "empty.yaml",
        "vary": {"nic_gbps": [100]},
    }
    path = write_yaml(tmp_path / "sweep.yaml", spec)
    refused(invoke("sweep", path, "--out", tmp_path / "out"), "empty.yaml", "no GPU or model entries")
    assert not (tmp_path / "out").exists()
