"""``dtype: auto`` picks bfloat16 only where it runs natively; the capability probes are faked."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy.dtype_choice import choose_dtype, cpu_flags
from streamrl.policy.loading import resolve_dtype
from streamrl.training.config_files import load_config

AVX2_ONLY = {"fpu", "sse2", "avx", "avx2", "fma", "avx512f"}


@pytest.mark.parametrize(("flags", "expected"), [
    (AVX2_ONLY, "float32"),                       # bf16 emulated: ~1 GFLOP/s against 90 in float32
    (AVX2_ONLY | {"avx512_bf16"}, "float32"),     # native, but slower than float32 without AMX
    (AVX2_ONLY | {"amx_bf16", "amx_tile"}, "bfloat16"),
    (set(), "float32"),                           # unreadable cpuinfo: the safe choice
])
def test_cpu_choice_follows_native_bf16_support(flags, expected):
    name, reason = choose_dtype("cpu", flags=flags)
    assert name == expected
    assert reason


@pytest.mark.parametrize(("cuda_bf16", "expected"), [(True, "bfloat16"), (False, "float32")])
def test_cuda_choice_follows_the_device(cuda_bf16, expected):
    assert choose_dtype("cuda:0", cuda_bf16=cuda_bf16)[0] == expected


def test_other_devices_get_float32():
    assert choose_dtype("mps")[0] == "float32"


def test_cpu_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_auto_resolves_and_says_what_it_chose(monkeypatch, capsys):
    import streamrl.policy.loading as loading

    monkeypatch.setattr(loading, "choose_dtype", lambda device: ("float32", "faked probe"))
    monkeypatch.setattr(loading, "_ANNOUNCED", set())
    assert resolve_dtype("auto") is torch.float32
    assert resolve_dtype("auto") is torch.float32
    err = capsys.readouterr().err
    assert err.count("dtype auto -> float32 on cpu (faked probe)") == 1  # said once


def test_auto_is_a_config_value():
    assert load_config("configs/smoke.yaml", ["model.dtype=auto"]).model.dtype == "auto"
