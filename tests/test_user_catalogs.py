"""Issue #13: the GPUs people plan with now, user catalogs (--catalog, inline GPUs), models import."""

import json

import pytest
import yaml

from clustersim import catalog
from clustersim.cli import app
from tests.inputs_support import LLAMA2_7B

NEW_GPUS = ["B200", "GB200", "MI250X", "MI300X", "H20", "L40S", "L4", "A10G", "RTX-4090"]


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


def small_scenario(gpu, nodes=2, gpus_per_node=4) -> dict:
    links = gpu["nvlink"]["links"] if isinstance(gpu, dict) else catalog.gpu(gpu).nvlink.links
    fabric = "nvswitch" if links else "pcie"
    return {
        "name": f"small-{gpu if isinstance(gpu, str) else gpu['name']}",
        "cluster": {
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "gpu": gpu,
            "intra_node": {"fabric": fabric},
            "nic": {"kind": "infiniband", "count": 1, "line_rate_gbps": 200},
        },
        "workload": {
            "layers": [{"name": "block", "params": 5.0e7, "forward_flops": 2.0e11, "repeat": 8}],
            "micro_batch": 4,
            "precision": "bf16",
        },
        "training": {"optimizer": "adam"},
    }


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_loads_with_its_source(name):
    g = catalog.gpu(name)
    assert g.name == name and g.peak_flops("bf16") > g.peak_flops("fp32") > 0
    assert g.hbm_gbs > 0 and g.memory_gib > 0 and g.cuda_name is not None
    source = catalog.resources.files("clustersim.catalogs").joinpath("gpus.yaml").read_text()
    block = source.split(f"\n{name}:\n", 1)[1].split("\n  description:", 1)[0]
    assert "#" in block, f"{name} has no source comment"


@pytest.mark.parametrize(
    "device,memory,expected",
    [
        ("NVIDIA B200", 179.0, "B200"),
        ("NVIDIA GB200", 185.0, "GB200"),
        ("NVIDIA H20", 95.0, "H20"),
        ("NVIDIA H200", 139.0, "H200"),
        ("NVIDIA L4", 22.0, "L4"),
        ("NVIDIA L40S", 44.0, "L40S"),
        ("NVIDIA A10G", 22.0, "A10G"),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX-4090"),
        ("AMD Instinct MI250X", 64.0, "MI250X"),
        ("AMD Instinct MI300X", 192.0, "MI300X"),
    ],
)
def test_cuda_names_find_the_new_gpus(device, memory, expected):
    assert catalog.gpu_for_cuda_name(device, memory) == expected


def test_hardware_list_shows_the_new_gpus(runner):
    r = invoke(runner, "hardware", "list", "--json")
    assert r.exit_code == 0, r.output
    assert set(NEW_GPUS) <= set(json.loads(r.stdout))
    r = invoke(runner, "hardware", "list")
    assert r.exit_code == 0 and all(n in r.output for n in NEW_GPUS)


@pytest.mark.parametrize("name", NEW_GPUS)
def test_a_scenario_runs_on_each_new_gpu(runner, tmp_path, name):
    path = write(tmp_path, "s.yaml", small_scenario(name))
    r = invoke(runner, "run", path, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] > 0


def _time(runner, tmp_path, gpu) -> float:
    r = invoke(runner, "run", write(tmp_path, "s.yaml", small_scenario(gpu)), "--samples", "0", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["iteration_time_s"]


@pytest.mark.parametrize("name", NEW_GPUS)
def test_more_hbm_bandwidth_is_never_slower(runner, tmp_path, name):
    base = catalog.gpu(name).model_dump()
    times = []
    for factor in (0.5, 1.0, 2.0):
        spec = dict(base, name=f"{name}-hbm-x{factor}", hbm_gbs=base["hbm_gbs"] * factor)
        times.append(_time(runner, tmp_path, spec))
    assert times[0] >= times[1] >= times[2]


X100 = {
    "chip": "X100",
    "description": "a hypothetical GPU",
    "peak_tflops": {"fp32": 100.0, "fp16": 3000.0, "bf16": 3000.0},
    "hbm_gbs": 12000,
    "memory_gib": 256,
    "nvlink": {"links": 18, "gbs_per_link": 80.0},
    "pcie_gen": 5,
}


@pytest.fixture
def user_catalog(tmp_path):
    slow_h100 = dict(catalog.gpu("H100-SXM").model_dump(exclude={"name"}), hbm_gbs=1000.0)
    return write(tmp_path, "my-gpus.yaml", {"X100": X100, "H100-SXM": slow_h100})


@pytest.mark.parametrize(
    "args",
    [
        ("run", "{s}", "--samples", "0", "--json"),
        ("compare", "{s}", "--json"),
        ("collective", "{s}", "--op", "all_reduce", "--bytes", "32MiB", "--json"),
        ("topology", "show", "{s}", "--json"),
        ("offload", "plan", "{s}", "--json"),
        ("hardware", "show", "X100", "--json"),
        ("hardware", "list", "--json"),
    ],
)
def test_catalog_option_adds_gpus(runner, tmp_path, user_catalog, args):
    s = write(tmp_path, "s.yaml", small_scenario("H100-SXM") | {"name": "x"})
    data = yaml.safe_load(s.read_text())
    data["cluster"]["gpu"] = "X100"
    s.write_text(yaml.safe_dump(data))
    args = [a.format(s=s) for a in args]
    r = invoke(runner, *args, "--catalog", user_catalog)
    assert r.exit_code == 0, r.output
    r = invoke(runner, *args)  # without it, X100 is unknown: one line, exit 2
    if args[0] != "hardware" or args[1] == "show":
        assert r.exit_code == 2 and "X100" in r.output and "Traceback" not in r.output


def test_catalog_entry_overrides_the_shipped_one(runner, tmp_path, user_catalog):
    s = write(tmp_path, "s.yaml", small_scenario("H100-SXM"))
    shipped = _run_time(runner, s)
    assert _run_time(runner, s, "--catalog", user_catalog) > shipped  # its HBM is a third as fast
    assert _run_time(runner, s) == shipped  # and the shipped catalog is back afterwards
    r = invoke(runner, "hardware", "show", "h100-sxm", "--json", "--catalog", user_catalog)
    assert json.loads(r.stdout)["hbm_gbs"] == 1000.0


def _run_time(runner, path, *extra) -> float:
    r = invoke(runner, "run", path, "--samples", "0", "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["iteration_time_s"]


@pytest.mark.parametrize(
    "content,expected",
    [
        ({"X200": dict(X100, hbm_gbs=-5)}, "bad.yaml: X200.hbm_gbs: Input should be greater than 0"),
        (
            {"X200": {k: v for k, v in X100.items() if k != "chip"}},
            "bad.yaml: X200.chip: required key is missing",
        ),
        ({"X200": dict(X100, colour="red")}, "bad.yaml: X200.colour: unknown key"),
        ({"X200": 5}, "bad.yaml: X200: expected a mapping"),
        ([1, 2], "bad.yaml: expected a mapping of names"),
        ("[1, 2", "bad.yaml: invalid YAML"),
        (None, "bad.yaml: file not found"),
    ],
)
def test_malformed_catalog_is_one_line_naming_file_and_key(runner, tmp_path, content, expected):
    path = tmp_path / "bad.yaml"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(yaml.safe_dump(content))
    for args in (("hardware", "list"), ("run", "preset:default", "--samples", "0")):
        r = invoke(runner, *args, "--catalog", path)
        assert r.exit_code == 2, r.output
        assert expected in " ".join(r.output.split()) and "Traceback" not in r.output


def test_inline_gpu_in_a_scenario(runner, tmp_path):
    s = write(tmp_path, "s.yaml", small_scenario(dict(X100, name="Z9")))
    r = invoke(runner, "run", s, "--samples", "0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] > 0
    r = invoke(runner, "topology", "show", s)
    assert r.exit_code == 0 and "Z9" in r.output


@pytest.mark.parametrize(
    "gpu,expected",
    [
        (dict(X100, name="Z9", hbm_gbs="fast"), "cluster.gpu.hbm_gbs"),
        (X100, "cluster.gpu.name: required key is missing"),
        (dict(X100, name=""), "cluster.gpu.name"),
        (5, "cluster.gpu: expected a GPU name or an inline GPU (a mapping)"),
    ],
)
def test_bad_inline_gpu_is_one_line(runner, tmp_path, gpu, expected):
    data = small_scenario("H100-SXM")
    data["cluster"]["gpu"] = gpu
    r = invoke(runner, "run", write(tmp_path, "s.yaml", data))
    assert r.exit_code == 2 and expected in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output


def _sweep(tmp_path, catalog_key=None) -> dict:
    data = small_scenario("H100-SXM")
    write(tmp_path, "base.yaml", data)
    sweep = {"base": "base.yaml", "vary": {"gpu": ["X100", "H100-SXM"], "gpus": [4, 8]}, "samples": 0}
    if catalog_key:
        sweep["catalog"] = catalog_key
    return sweep


def test_sweep_catalog_key_relative_to_the_sweep_file(runner, tmp_path, user_catalog):
    sub = tmp_path / "sweeps"
    sub.mkdir()
    (sub / "cat.yaml").write_text(user_catalog.read_text())
    path = write(sub, "sweep.yaml", _sweep(sub, "cat.yaml"))
    r = invoke(runner, "sweep", path, "--out", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["written"] == 4 and not d["invalid"]
    assert "X100" in (tmp_path / "out" / "results.csv").read_text()


def test_sweep_catalog_option(runner, tmp_path, user_catalog):
    path = write(tmp_path, "sweep.yaml", _sweep(tmp_path))
    r = invoke(runner, "sweep", path, "--out", tmp_path / "out", "--json")
    assert r.exit_code == 2 and "X100" in r.output  # unknown without the catalog
    r = invoke(runner, "sweep", path, "--out", tmp_path / "out", "--json", "--catalog", user_catalog)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["written"] == 4


def test_sweep_with_a_bad_catalog_key_names_the_file(runner, tmp_path):
    path = write(tmp_path, "sweep.yaml", _sweep(tmp_path, "missing.yaml"))
    r = invoke(runner, "sweep", path, "--out", tmp_path / "out")
    assert r.exit_code == 2 and "missing.yaml" in r.output and "Traceback" not in r.output


def test_plan_with_a_candidates_catalog_and_the_option(runner, tmp_path, user_catalog):
    base = small_scenario("H100-SXM", nodes=1, gpus_per_node=8)
    base["workload"] = {"model": "BERT-Large", "micro_batch": 8, "precision": "bf16"}
    cands = {"base": base, "vary": {"gpu": ["X100", "H100-SXM"], "gpus": [8, 16]}, "catalog": "my-gpus.yaml"}
    path = write(tmp_path, "cands.yaml", cands)
    args = ("plan", "--model", "GPT-3-1.3B", "--steps", "100", "--deadline", "3d", "--samples", "0")
    r = invoke(runner, *args, "--candidates", path, "--price", "2", "--json")
    assert r.exit_code == 0, r.output
    assert "X100" in r.output
    r = invoke(runner, *args, "--candidates", path)  # no price known for a user GPU
    assert r.exit_code == 2 and "no instance in instances.yaml sells X100" in r.output
    r = invoke(runner, *args, "--candidates", path, "--cost", "own")  # nor a server price: left out, said
    assert r.exit_code == 0 and "X100 left out, no server price in ownership.yaml" in r.output, r.output
    r = invoke(runner, *args, "--catalog", user_catalog)  # the built-in candidates, slowed-down H100s
    assert r.exit_code == 0, r.output


def test_default_cpu_adam_rate_is_the_measured_one():
    from clustersim.catalog import hardware_defaults
    from clustersim.scenario import load_scenario
    from clustersim.simulator import simulate

    assert hardware_defaults()["host"]["cpu_adam_params_per_s"] == 1.51e9  # Deep Optimizer States
    r = simulate(load_scenario("preset:offload-llama7b-h100"))
    assert r.extra["offload"]["cpu_params_per_s"] == pytest.approx(1.51e9)


# Hugging Face config.json values as published (openai-community/gpt2,
# mistralai/Mistral-7B-v0.1).
GPT2 = {
    "_name_or_path": "openai-community/gpt2",
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": None,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}


def _import(runner, tmp_path, cfg, *extra):
    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(cfg))
    return invoke(runner, "models", "import", path, *extra)


@pytest.mark.parametrize(
    "cfg,expected,tol",
    [
        (LLAMA2_7B, 6.738e9, 0.01),  # HF: 6,738,415,616
        (GPT2, 124.44e6, 0.02),  # HF: 124,439,808 (tied head)
        (MISTRAL_7B, 7.2417e9, 0.01),  # HF: 7,241,732,096 (grouped-query attention, 8 KV heads)
    ],
)
def test_models_import_parameter_counts(runner, tmp_path, cfg, expected, tol):
    r = _import(runner, tmp_path, cfg, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert abs(d["params"] - expected) / expected <= tol, d["params"]


def test_models_import_refuses_a_name_a_catalog_would_refuse(runner, tmp_path):
    """NAME-<N>L names a catalog model cut to N layers: an imported model may not take it, and nothing is
    written (a catalog holding it would be refused when read back)."""
    out = tmp_path / "my-models.yaml"
    r = _import(runner, tmp_path, GPT2, "--name", "tiny-gpt-2L", "--out", out)
    assert r.exit_code == 2 and "--name" in r.output and "may not end in -<N>L" in r.output
    assert not out.exists()


def test_models_import_writes_a_catalog_that_runs(runner, tmp_path):
    out = tmp_path / "my-models.yaml"
    r = _import(runner, tmp_path, LLAMA2_7B, "--name", "Llama-2-7B", "--out", out)
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(out.read_text())["Llama-2-7B"]["style"] == "llama"
    r = _import(runner, tmp_path, GPT2, "--out", out)  # appended, named from _name_or_path
    assert r.exit_code == 0 and set(yaml.safe_load(out.read_text())) == {"Llama-2-7B", "gpt2"}
    r = _import(runner, tmp_path, GPT2, "--out", out)
    assert r.exit_code == 2 and "each name once in this file" in r.output
    r = invoke(runner, "models", "show", "Llama-2-7B", "--json", "--catalog", out)
    assert r.exit_code == 0 and json.loads(r.stdout)["params"] == 6_738_415_616
    data = small_scenario("H100-SXM", nodes=1, gpus_per_node=8)
    data["workload"] = {"model": "Llama-2-7B", "micro_batch": 1, "seq_len": 1024, "precision": "bf16"}
    data["training"]["offload"] = {"mode": "zero"}
    s = write(tmp_path, "s.yaml", data)
    assert invoke(runner, "run", s, "--samples", "0", "--catalog", out).exit_code == 0
    r = invoke(runner, "run", s, "--samples", "0")
    assert r.exit_code == 2 and "Llama-2-7B" in r.output


def test_models_import_prints_yaml_by_default(runner, tmp_path):
    r = _import(runner, tmp_path, LLAMA2_7B)
    assert r.exit_code == 0, r.output
    entry = yaml.safe_load(r.stdout)["hf"]  # named after the folder holding config.json
    assert entry["layers"] == 32 and entry["ffn"] == 11008 and entry["max_positions"] == 0


@pytest.mark.parametrize(
    "cfg,expected",
    [
        ({k: v for k, v in LLAMA2_7B.items() if k != "hidden_size"}, "no hidden_size"),
        (dict(LLAMA2_7B, num_hidden_layers="32"), "num_hidden_layers: expected a positive integer"),
        (dict(LLAMA2_7B, num_local_experts=8), "mixture-of-experts"),
        ([1, 2], "expected a JSON object"),
        # a learned position table's size is part of the model: GPT-2 without it is refused, not
        # imported with no table (Llama's RoPE has none, so there it may be absent)
        ({k: v for k, v in GPT2.items() if k not in ("n_positions", "n_ctx")}, "no max_position_embeddings"),
    ],
)
def test_models_import_bad_config_is_one_line(runner, tmp_path, cfg, expected):
    r = _import(runner, tmp_path, cfg)
    assert r.exit_code == 2 and expected in " ".join(r.output.split()), r.output
    assert "config.json" in r.output and "Traceback" not in r.output


def test_models_import_unreadable_config(runner, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    r = invoke(runner, "models", "import", bad)
    assert r.exit_code == 2 and "invalid JSON" in r.output
    r = invoke(runner, "models", "import", tmp_path / "missing.json")
    assert r.exit_code == 2 and "file not found" in r.output


def test_sweep_resume_refuses_a_changed_catalog(runner, tmp_path, user_catalog):
    path = write(tmp_path, "sweep.yaml", _sweep(tmp_path, user_catalog.name))
    out = tmp_path / "out"
    assert invoke(runner, "sweep", path, "--out", out, "--json").exit_code == 0
    r = invoke(runner, "sweep", path, "--out", out, "--json")  # same catalog: resumes, nothing to do
    assert r.exit_code == 0 and json.loads(r.stdout)["skipped"] == 4
    data = yaml.safe_load(user_catalog.read_text())
    data["X100"]["hbm_gbs"] = 6000
    user_catalog.write_text(yaml.safe_dump(data))
    r = invoke(runner, "sweep", path, "--out", out, "--json")  # another X100: another sweep
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_a_user_gpu_carries_its_price_into_plan_and_report(tmp_path):
    """A user catalog entry may name its price per GPU-hour; without one (and no --price) the message
    says both ways to give it."""
    from clustersim.errors import InputError
    from clustersim.report.analysis import price_of

    gpu = X100
    priced = write(tmp_path, "priced.yaml", {"X100": {**gpu, "price_per_gpu_hour": 20.0}})
    unpriced = write(tmp_path, "unpriced.yaml", {"X100": gpu})
    with catalog.user_catalogs([priced]):
        assert price_of("X100", None) == 20.0
        assert price_of("X100", 3.0) == 3.0  # --price wins
    with catalog.user_catalogs([unpriced]), pytest.raises(InputError) as exc:
        price_of("X100", None)
    assert "price_per_gpu_hour" in str(exc.value) and "--price" in str(exc.value)
    assert price_of("H100-SXM", None) == 12.29  # shipped GPUs keep prices.yaml


def test_hardware_show_prints_values_as_a_reader_writes_them(runner):
    res = invoke(runner, "hardware", "show", "H100-SXM")
    assert res.exit_code == 0
    assert "{" not in res.output and "'" not in res.output
    assert "peak_tflops: fp32 66.9, tf32 494.7" in res.output


def test_compares_pricing_messages_name_only_options_compare_has(runner, tmp_path, user_catalog):
    """compare has --cost, --instance, --instances, --own-prices and --catalog but no --price: its
    messages about pricing never send the user to an option it would refuse."""
    common = ("--samples", "0", "--gpus", "8", "--steps", "1000", "--optimizers", "adam")
    r = invoke(runner, "compare", "preset:default", "--cost", "own", "--instance", "p5.48xlarge", *common)
    assert r.exit_code == 2 and "--instance prices a rented cluster; drop it or use --cost rent" in r.output
    assert "--price" not in r.output
    s = write(tmp_path, "s.yaml", dict(small_scenario("H100-SXM"), name="x"))
    data = yaml.safe_load(s.read_text())
    data["cluster"]["gpu"] = "X100"
    s.write_text(yaml.safe_dump(data))
    r = invoke(runner, "compare", s, "--cost", "rent", "--catalog", user_catalog, *common)
    assert r.exit_code == 2 and "no instance in instances.yaml sells X100" in r.output, r.output
    assert "--price " not in r.output and "--instances FILE" in r.output and "--catalog" in r.output
    for command in ("compare", "plan", "report"):  # --cost's help names what makes it rented there
        text = invoke(runner, command, "--help").output
        assert ("--price" in text) == (command != "compare"), command


def test_hardware_list_and_show_write_numbers_as_the_other_tables_do(runner, user_catalog):
    """`hardware list` printed 12000.0 and 1555.0 GB/s (every other table writes 12,000.0) and `hardware
    show` of a user GPU without cuda_name printed 'cuda_name: None'."""
    r = invoke(runner, "hardware", "list", "--catalog", user_catalog)
    assert r.exit_code == 0, r.output
    x100 = next(line for line in r.stdout.splitlines() if line.startswith("X100 "))
    assert x100.split()[1:5] == ["3,000.0", "3,000.0", "12,000.0", "256.0"]
    assert "1,555.0" in r.stdout  # A100-40GB's HBM
    show = invoke(runner, "hardware", "show", "X100", "--catalog", user_catalog)
    assert show.exit_code == 0 and "None" not in show.stdout
    assert "hbm_gbs: 12,000.0" in show.stdout and "fp16 3,000.0" in show.stdout


def test_the_built_in_grid_takes_in_a_user_catalogs_gpus():
    """`plan`'s default grid is every GPU of the catalog: a GPU added with --catalog was never a
    candidate nor named among those left out of owned cost. It joins the grid (a PCIe server where it
    has no NVLink, fp16 where it has no bf16), and owned plans name it among the GPUs without a server
    price; an override of a shipped GPU is not added twice."""
    from clustersim.planner.planning import _priced_only, candidate_sweep

    mine = catalog.gpu("H100-SXM").model_dump(exclude={"name"})
    card = dict(mine, nvlink={"links": 0, "gbs_per_link": 0}, peak_tflops={"fp32": 50.0, "fp16": 200.0})
    entries = {"MYGPU": catalog.parse_gpu_entry("MYGPU", mine, "cat.yaml", "MYGPU")}
    entries["MYCARD"] = catalog.parse_gpu_entry("MYCARD", card, "cat.yaml", "MYCARD")
    entries["H100-SXM"] = entries["MYGPU"]
    with catalog.user_entries(entries):
        sweep = candidate_sweep(None)
        rows = sweep.rows()
        gpus = [r["gpu"] for r in rows]
        assert gpus.count("MYGPU") == gpus.count("A100-80GB") == gpus.count("MYCARD") > 0
        assert gpus.count("H100-SXM") == gpus.count("A100-80GB")
        card_rows = [r for r in rows if r["gpu"] == "MYCARD"]
        assert all(r.get("fabric") == "pcie" and r.get("precision") == "fp16" for r in card_rows)
        assert not any("fabric" in r or "precision" in r for r in rows if r["gpu"] == "MYGPU")
        notes: list[str] = []
        kept = _priced_only(sweep.base, rows, None, None, "default", notes, True)
    assert not any(r["gpu"] in ("MYGPU", "MYCARD") for r in kept)
    assert "MYCARD" in notes[0] and "MYGPU" in notes[0] and "left out, no server price" in notes[0]
    # what would price them on plan: their server prices, or a flat rate (renting as sold would not)
    assert "--own-prices FILE" in notes[0] and "--price" in notes[0] and "--cost rent" not in notes[0]
    assert len(candidate_sweep(None).rows()) < len(rows)  # out of the catalog's block, out of the grid
