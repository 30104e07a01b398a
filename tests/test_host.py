"""The speed dtype follows the host: bf16 where the CPU multiplies it natively, fp32 elsewhere
(the capability probe faked for both host classes)."""
import pytest

from specdec import host
from specdec.host import torch_dtype


@pytest.fixture
def fake_host(monkeypatch):
    def make(flags, isa):
        monkeypatch.setattr(host, "cpu_flags", lambda: set(flags))
        monkeypatch.setattr(host, "isa_level", lambda: isa)
        monkeypatch.setattr(host, "cpu_model", lambda: "AMD EPYC")
    return make


def test_avx2_only_host_times_in_fp32(fake_host):
    import torch
    fake_host({"avx2", "fma"}, "AVX2")
    cap = host.capability()
    assert cap == {"cpu_model": "AMD EPYC", "isa": "AVX2", "native_bf16": False, "bf16_flags": []}
    dtype, why = host.speed_dtype("cpu")
    assert dtype == "float32" and "no native bf16" in why
    assert host.resolve_dtype("auto") == "float32" and torch_dtype("auto") == torch.float32
    assert host.dtype_record("auto")["dtype"] == "float32"
    assert host.resolve_dtype("bfloat16") == "bfloat16"   # an explicit dtype is kept


@pytest.mark.parametrize("flags", [{"avx512f", "avx512_bf16"}, {"avx512f", "amx_bf16", "avx512_bf16"}])
def test_native_bf16_host_times_in_bf16(fake_host, flags):
    import torch
    fake_host(flags, "AVX512")
    assert host.capability()["native_bf16"]
    assert host.speed_dtype("cpu")[0] == "bfloat16" and torch_dtype("auto") == torch.bfloat16
    rec = host.dtype_record("auto")
    assert rec["dtype_requested"] == "auto" and "natively" in rec["dtype_reason"]


def test_avx512_without_bf16_is_not_native(fake_host):
    fake_host({"avx512f", "avx512bw"}, "AVX512")
    assert host.speed_dtype("cpu")[0] == "float32"


def test_cuda_is_bf16_whatever_the_cpu(fake_host):
    fake_host({"avx2"}, "AVX2")
    assert host.speed_dtype("cuda:0")[0] == "bfloat16"


def test_the_real_probe_reads_this_host():
    cap = host.capability()
    assert cap["isa"] and isinstance(cap["native_bf16"], bool)


def test_sizing_follows_the_planning_host(fake_host):
    """config `sizing`: the class `auto` names is this machine's speed dtype for the config's
    device; an explicit class wins; a class the config does not size replaces nothing."""
    config = {"device": "cpu", "sizing": {"host": "auto", "float32": {"bench": {"datasets": {"x": {"prompts": 4}}}}}}
    fake_host({"avx2"}, "AVX2")
    assert host.sizing(config) == ("float32", {"bench": {"datasets": {"x": {"prompts": 4}}}})
    assert host.sizing({**config, "device": "cuda"}) == ("bfloat16", {})
    fake_host({"avx512f", "avx512_bf16"}, "AVX512")
    assert host.sizing(config) == ("bfloat16", {})
    assert host.sizing({**config, "sizing": {**config["sizing"], "host": "float32"}})[0] == "float32"
    assert host.sizing({"device": "cpu"}) == ("bfloat16", {})   # no sizing section: the config as written
