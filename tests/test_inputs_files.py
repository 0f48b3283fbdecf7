"""The input battery, files: every structured file a command reads goes through one reader
(clustersim/io.py), so a named pipe, a device, a file too large, bytes that are not UTF-8, nesting deep
enough to overflow a parser and a key given twice are refused the same way for every kind of file:
exit code 2, one line naming the file, nothing of its content echoed."""

from __future__ import annotations

import os

import pytest

from tests.inputs_support import SCENARIO, changed, invoke, refused, write_yaml

# (kind of file, suffix, command line with {f} for the file and {tmp} for a scratch folder)
ENTRY_PATHS = {
    "scenario": (".yaml", ("run", "{f}", "--samples", "0")),
    "scenario-json": (".json", ("run", "{f}", "--samples", "0")),
    "catalog": (".yaml", ("hardware", "list", "--catalog", "{f}")),
    "profile": (".json", ("run", "preset:default", "--samples", "0", "--profile", "{f}")),
    "hf-config": (".json", ("models", "import", "{f}")),
    "sweep": (".yaml", ("sweep", "{f}", "--out", "{tmp}/out")),
    "raw": (".json", ("calibrate", "fit", "{f}", "--out", "{tmp}/p.json")),
    "nccl-tests": (".txt", ("calibrate", "import-nccl-tests", "{f}", "--out", "{tmp}/p.json")),
}

DEEP = 5000  # beyond Python's recursion limit (1000): the parsers overflowed before the reader's check

# (bad file, how to make it at a path, words the error must say)
BAD_FILES = {
    "deep-list": (lambda p: p.write_text("[" * DEEP + "]" * DEEP), "nested deeper than"),
    "deep-map": (lambda p: p.write_text('{"a":' * DEEP + "1" + "}" * DEEP), "nested deeper than"),
    "not-utf8": (lambda p: p.write_bytes(b"name: x\n\xff\xfe\x80 bad: 1\n"), "not UTF-8"),
    "fifo": (lambda p: os.mkfifo(p), "named pipe"),
    "folder": (lambda p: p.mkdir(), "folder"),
    "missing": (lambda p: None, "not found"),
}


def _alias_bomb(path):
    """Ten levels of ten aliases each: a few hundred bytes that stand for 10**10 values."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    path.write_text("\n".join(lines) + "\n")


BAD_FILES["alias-bomb"] = (_alias_bomb, "once its YAML aliases are expanded")
BAD_FILES["alias-loop"] = (lambda p: p.write_text("a: &a [1, *a]\n"), "contains itself")
STRUCTURED_ONLY = {"deep-list", "deep-map"}
YAML_ONLY = {"alias-bomb", "alias-loop"}


def _run(kind, tmp_path, make):
    suffix, args = ENTRY_PATHS[kind]
    path = tmp_path / f"input{suffix}"
    make(path)
    return invoke(*(a.format(f=path, tmp=tmp_path) for a in args)), str(path)


@pytest.mark.parametrize("bad", sorted(BAD_FILES))
@pytest.mark.parametrize("kind", sorted(ENTRY_PATHS))
def test_a_bad_file_is_refused_the_same_way_on_every_path(tmp_path, kind, bad):
    make, words = BAD_FILES[bad]
    if bad in STRUCTURED_ONLY | YAML_ONLY and kind == "nccl-tests":
        pytest.skip("nccl-tests text logs are not nested structures")
    if bad in YAML_ONLY and ENTRY_PATHS[kind][0] == ".json":
        pytest.skip("JSON has no aliases")
    r, path = _run(kind, tmp_path, make)
    refused(r, path, words)


@pytest.mark.parametrize("kind", sorted(ENTRY_PATHS))
def test_a_device_is_refused_before_reading(tmp_path, kind):
    """/dev/zero never ends: it used to be read into memory until a MemoryError."""
    _, args = ENTRY_PATHS[kind]
    r = invoke(*(a.format(f="/dev/zero", tmp=tmp_path) for a in args))
    refused(r, "/dev/zero", "not a regular file")


@pytest.mark.parametrize("kind", sorted(ENTRY_PATHS))
def test_a_file_beyond_the_size_limit_is_refused(tmp_path, monkeypatch, kind):
    import clustersim.io

    monkeypatch.setattr(clustersim.io, "MAX_INPUT_BYTES", 100)
    r, path = _run(kind, tmp_path, lambda p: p.write_text("#" * 101 + "\n"))
    refused(r, path, "more than an input file may hold")


@pytest.mark.parametrize("kind", ["scenario-json", "profile", "hf-config", "raw"])
def test_a_json_key_given_twice_is_refused(tmp_path, kind):
    r, path = _run(kind, tmp_path, lambda p: p.write_text('{"a": 1, "a": 2}'))
    refused(r, path, "'a' given twice")


SECRET = "root:$6$s3cr3tHash:19000:0:99999:7:::"


@pytest.mark.parametrize(
    "kind,text",
    [
        ("catalog", SECRET + "\ndaemon:*:19000:0:99999:7:::\n"),
        ("catalog", SECRET + "\n"),
        ("scenario", SECRET + "\n"),
        ("profile", SECRET + "\n"),
        ("raw", SECRET + "\n"),
        ("hf-config", SECRET + "\n"),
        ("nccl-tests", SECRET + "\n"),
    ],
)
def test_an_error_never_echoes_the_file(tmp_path, kind, text):
    r, path = _run(kind, tmp_path, lambda p: p.write_text(text))
    out = refused(r, path)
    assert "s3cr3t" not in out and "daemon" not in out, out


def test_a_sweep_naming_a_foreign_file_as_its_catalog_does_not_print_it(tmp_path):
    """``catalog: ../../etc/shadow`` in a sweep file: the error names the file, never its first line."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\ndaemon:*:19000:0:99999:7:::\n")
    sweep = {"name": "s", "base": "preset:default", "catalog": "../shadow", "vary": {"nodes": [1, 2]}}
    folder = tmp_path / "sweeps"
    folder.mkdir()
    path = write_yaml(folder / "sweep.yaml", sweep)
    out = refused(invoke("sweep", path, "--out", tmp_path / "out"), "shadow")
    assert "s3cr3t" not in out and "daemon" not in out, out


def test_a_scenario_after_the_reader_still_runs(tmp_path):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, None, None))
    r = invoke("run", path, "--samples", "0")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("kind", ["catalog", "scenario-json"])
def test_a_repeated_line_of_a_foreign_file_is_not_printed_as_a_key(tmp_path, kind):
    text = f'{{"{SECRET}": 1, "{SECRET}": 2}}' if kind.endswith("json") else f"{SECRET}\n{SECRET}\n"
    r, path = _run(kind, tmp_path, lambda p: p.write_text(text))
    out = refused(r, path, "given twice")
    assert "s3cr3t" not in out, out


def test_an_alias_bomb_is_refused_by_the_section_it_sits_under(tmp_path):
    """The bomb under a scenario's training.optimizer_options: the line names that key."""
    lines = ['    l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    path = tmp_path / "s.yaml"
    path.write_text(
        "cluster: {nodes: 2, gpus_per_node: 4, gpu: A100-80GB}\n"
        "workload: {model: BERT-Large, micro_batch: 8}\n"
        "training:\n  optimizer: adam\n  optimizer_options:\n" + "\n".join(lines) + "\n"
    )
    refused(invoke("run", path, "--samples", "0"), str(path), "training.optimizer_options:", "aliases")
