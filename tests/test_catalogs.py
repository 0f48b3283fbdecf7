import pytest

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.scenario import WorkloadSpec
from clustersim.workloads import build_workload


@pytest.mark.parametrize(
    "name,expected,tol",
    [
        ("BERT-Base", 110e6, 0.02),  # Devlin et al. 2019
        ("BERT-Large", 340e6, 0.02),  # Devlin et al. 2019 ("340M")
        ("ResNet-50", 25.557032e6, 1e-9),  # torchvision resnet50: 25,557,032 exactly
        ("ResNet-101", 44_549_160, 1e-9),  # torchvision resnet101: 44,549,160 exactly
        ("ResNet-152", 60_192_808, 1e-9),  # torchvision resnet152: 60,192,808 exactly
        (
            "GPT-2-1.5B",
            1.5576e9,
            0.01,
        ),  # Radford et al. 2019 (1542M reported; 1557.6M with the tied head counted once)
        ("GPT-2-124M", 124_439_808, 1e-9),  # Hugging Face gpt2, exactly
        ("GPT-2-355M", 354_823_168, 1e-9),  # gpt2-medium
        ("GPT-2-774M", 774_030_080, 1e-9),  # gpt2-large
        ("LLaMA-7B", 6.738e9, 0.005),  # Touvron et al. 2023: 6.7B (HF count 6,738,415,616)
        ("GPT-3-175B", 175e9, 0.01),  # Brown et al. 2020
        ("GPT-3-13B", 13e9, 0.02),  # 12.85e9 at hidden 5120 (the paper's 5140 is not 40 x 128)
        ("GPT-3-1.3B", 1.3e9, 0.03),
        ("LLaMA-2-70B", 68_976_648_192, 1e-9),  # meta-llama/Llama-2-70b-hf: 68,976,648,192 exactly
        ("LLaMA-2-13B", 13_015_864_320, 1e-9),  # meta-llama/Llama-2-13b-hf
        ("Llama-3-8B", 8_030_261_248, 1e-9),  # meta-llama/Meta-Llama-3-8B
        ("Llama-3-70B", 70_553_706_496, 1e-9),  # meta-llama/Meta-Llama-3-70B
        ("Llama-3.1-405B", 405_853_388_800, 1e-9),  # meta-llama/Llama-3.1-405B
        ("Megatron-GPT-145.6B", 145.6e9, 0.001),  # Narayanan et al. SC'21 Table 1
        ("Megatron-GPT-529.6B", 529.6e9, 0.001),
        ("Megatron-GPT-1T", 1008.0e9, 0.001),
        ("Megatron-GPT-22B", 22e9, 0.01),  # Korthikanti et al. 2022 Table 3
        ("Megatron-GPT-175B", 175e9, 0.01),
        ("Nemotron-4-15B", 15.7e9, 0.01),  # arXiv:2402.16819: 12.5B non-embedding + 3.2B embedding
        ("Nemotron-4-340B", 341.0e9, 0.001),  # arXiv:2406.11704: 331.6B non-embedding + 9.4B embedding
    ],
)
def test_parameter_counts_match_published(name, expected, tol):
    w = build_workload(WorkloadSpec(model=name, micro_batch=1))
    assert abs(w.params - expected) / expected <= tol


@pytest.mark.parametrize("name,gmacs", [("ResNet-50", 4.09), ("ResNet-101", 7.80), ("ResNet-152", 11.51)])
def test_resnet_forward_flops_match_published(name, gmacs):
    # at 224x224, v1.5 (the stride on the 3x3 convolution): torchvision's model table lists 4.09, 7.80 and
    # 11.51 GFLOPS, counted as multiply-accumulates (fvcore), so twice that in FLOPs
    w = build_workload(WorkloadSpec(model=name, micro_batch=1))
    assert abs(w.forward_flops - 2 * gmacs * 1e9) / (2 * gmacs * 1e9) < 0.02


def test_transformer_flops_follow_6nd_rule():
    # Training FLOPs ~ 6 * params * tokens (Kaplan et al. 2020) plus attention; within 15% for GPT-3 1.3B
    w = build_workload(WorkloadSpec(model="GPT-3-1.3B", micro_batch=1, seq_len=2048))
    train = w.forward_flops + w.backward_flops
    assert 1.0 <= train / (6 * w.params * 2048) < 1.3


def test_flops_scale_linearly_with_micro_batch():
    a = build_workload(WorkloadSpec(model="BERT-Base", micro_batch=1, seq_len=128))
    b = build_workload(WorkloadSpec(model="BERT-Base", micro_batch=8, seq_len=128))
    assert b.forward_flops == pytest.approx(8 * a.forward_flops)
    assert b.params == a.params


def test_unknown_gpu_and_model_are_input_errors():
    with pytest.raises(InputError, match="unknown GPU"):
        catalog.gpu("Z100")
    with pytest.raises(InputError, match="unknown model"):
        catalog.model("BERT-Huge")


def test_lookup_is_case_insensitive():
    assert catalog.gpu("h100-sxm").name == "H100-SXM"


def test_every_gpu_has_consistent_properties():
    for g in catalog.gpus().values():
        assert g.peak_flops("fp32") > 0 and g.hbm_bytes_per_s > 0
        assert g.nvlink.links == 0 or g.nvlink.gbs_per_link > 0


def test_cuda_device_names_map_to_catalog_entries_from_data():
    from clustersim.calibration.torch_support import catalog_name_from_string as name_of

    assert name_of("NVIDIA H100 80GB HBM3", 80) == "H100-SXM"
    assert name_of("NVIDIA H100 PCIe", 80) == "H100-PCIe"
    assert name_of("NVIDIA A100-SXM4-40GB", 40) == "A100-40GB"
    assert name_of("NVIDIA A100-SXM4-80GB", 80) == "A100-80GB"
    assert name_of("Tesla V100-PCIE-32GB", 32) == "V100-PCIe"
    assert name_of("NVIDIA H200", 141) == "H200"
    assert name_of("AMD Instinct MI250X", 64) == "MI250X"  # in the catalog since issue #13
    assert name_of("Intel Data Center GPU Max 1550", 128) == "cpu"  # not in the catalog: nothing is guessed
