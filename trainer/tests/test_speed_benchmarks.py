"""Issue 15's benchmarks on the CPU, for function (no timed assertion): the peak measured in the process and the
share printed beside the result, the time-per-part table of --profile, the target forward's FLOP count."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from trainer_testlib import load_benchmark
from dflash_trainer.config import default_target_layer_ids

matmul_peak = load_benchmark("benchmarks.matmul_peak")
profile_parts = load_benchmark("benchmarks.profile_parts")


def test_measured_peak_is_a_positive_rate_of_the_asked_product():
    peak = matmul_peak.measure_peak(torch.device("cpu"), 64)
    assert peak["tflops"] > 0 and (peak["n"], peak["dtype"], peak["device"]) == (64, "float32", "cpu")
    assert "best of ten 64^3 float32" in matmul_peak.describe(peak)


@pytest.mark.parametrize("name,ancestors,part", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", ("aten::mm", "aten::linear"), "linears"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", ("aten::addmm",), "linears"),
    ("aten::mm", ("MmBackward0",), "linears"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", ("aten::mm", "_ChunkedHeadLoss"), "head + loss"),
    ("triton_red_fused__log_softmax_nll_loss_forward_0", (), "head + loss"),
    ("triton_tem_fused_flex_attention_0", ("Torch-Compiled Region: 0/1",), "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", ("aten::_flash_attention_forward",),
     "attention"),
    ("aten::bmm", ("aten::_scaled_dot_product_attention_math", "aten::scaled_dot_product_attention"), "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     ("aten::_fused_adamw_", "Optimizer.step#AdamW.step"), "optimizer"),
    ("aten::_foreach_norm", (), "optimizer"),
    ("aten::mul_", ("Optimizer.step#AdamW.step",), "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", (), "copies"),
    ("aten::copy_", ("aten::to",), "copies"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", (), "norms/elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", (),
     "norms/elementwise"),
    ("aten::add_", (), "norms/elementwise"),
    ("aten::expand", (), "other"),
    ("aten::addmm", (), "linears"),
    ("cudaStreamSynchronize", (), "other"),
])
def test_kernels_are_grouped_by_name_and_launching_ops(name, ancestors, part):
    assert profile_parts.part_of(name, ancestors) == part


def _event(id, name, parent=None, device_type=DeviceType.CPU, us=0.0):
    """A FunctionEvent as torch.profiler builds them (CUDA events need a GPU): a CPU op under its parent."""
    event = FunctionEvent(id, name, thread=1, start_us=0, end_us=us, device_type=device_type)
    if parent is not None:
        event.set_cpu_parent(parent)
    return event


def test_gpu_kernels_are_timed_with_the_ops_that_launched_them():
    """The profiler appends each kernel to the CPU event that launched it (torch 2.11 keeps no correlation id
    on the event; the first GPU run of --profile failed on it); the device's own copies of the kernels are
    not counted twice."""
    head = _event(1, "_ChunkedHeadLoss")
    mm = _event(2, "aten::mm", parent=head)
    launch = _event(3, "cudaLaunchKernel", parent=mm, us=5.0)
    launch.append_kernel("nvjet_tst_256x128", 0, 700.0)
    copy = _event(4, "cudaMemcpyAsync", us=3.0)
    copy.append_kernel("Memcpy HtoD (Pageable -> Device)", 0, 300.0)
    device_copy = _event(5, "nvjet_tst_256x128", device_type=DeviceType.CUDA, us=700.0)
    prof = SimpleNamespace(events=lambda: [head, mm, launch, copy, device_copy])
    assert profile_parts.profiler_items(prof, "cuda") == [
        ("nvjet_tst_256x128", ("cudaLaunchKernel", "aten::mm", "_ChunkedHeadLoss"), 7e-4),
        ("Memcpy HtoD (Pageable -> Device)", ("cudaMemcpyAsync",), 3e-4)]
    rows = profile_parts.time_table(profile_parts.profiler_items(prof, "cuda"), wall_s=2e-3)
    assert [(p, round(share, 3)) for p, _, share in rows if share] == [("head + loss", 0.35), ("copies", 0.15),
                                                                      ("host gaps", 0.5)]


def test_time_table_shares_sum_to_one_with_the_host_gaps():
    items = [("aten::mm", (), 0.3), ("flash_fwd", (), 0.2), ("Memset (Device)", (), 0.1), ("odd", (), 0.1)]
    rows = profile_parts.time_table(items, wall_s=1.0)
    table = {part: (s, share) for part, s, share in rows}
    assert [part for part, _, _ in rows] == list(profile_parts.PARTS) + ["host gaps"]
    assert table["linears"] == (0.3, 0.3) and table["other"][0] == 0.1
    assert table["host gaps"][0] == pytest.approx(0.3)
    assert sum(share for _, _, share in rows) == pytest.approx(1.0)
    # kernels overlapping (two streams): more kernel time than wall; no negative gap, shares still sum to 1
    rows = profile_parts.time_table(items, wall_s=0.5)
    assert dict((p, s) for p, s, _ in rows)["host gaps"] == 0.0
    assert sum(share for _, _, share in rows) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="nothing was timed"):
        profile_parts.time_table([], wall_s=0.0)


def test_train_step_prints_the_measured_peak_and_the_parts_of_a_profiled_step(tmp_path, capsys):
    out = tmp_path / "step.json"
    argv = ["--preset", "tiny-cpu", "--seq-len", "128", "--batch", "2", "--steps", "1", "--warmup", "1",
            "--profile", "--out", str(out)]
    assert load_benchmark("benchmarks.train_step").main(argv) == 0
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["peak"]["tflops"] > 0 and "--peak-tflops" not in load_benchmark("benchmarks.train_step").__doc__
    assert result["ratio_to_peak"] == pytest.approx(result["achieved_tflops"] / result["peak"]["tflops"])
    assert f"share of measured peak  {result['ratio_to_peak']:.4g}" in text
    assert "best of ten 512^3 float32 matrix products on cpu in this process" in text
    parts = result["profile"]["parts"]
    assert list(parts) == list(profile_parts.PARTS) + ["host gaps"]
    assert sum(p["share"] for p in parts.values()) == pytest.approx(1.0)
    # the tiny step's work is there, each in its part: the head inside _ChunkedHeadLoss, AdamW, the matmuls
    assert all(parts[p]["s_per_step"] > 0 for p in ("linears", "attention", "head + loss", "optimizer"))
    for part in parts:
        assert f"  {part:<18} " in text
    # the drafter's MLP width as dflash-train sets it (--draft-intermediate-size; the target's, 128, by default)
    assert "hidden 64 MLP 128 layers 2" in text
    wide = tmp_path / "wide.json"
    assert load_benchmark("benchmarks.train_step").main(argv[:-3] + ["--draft-intermediate-size", "256",
                                                                     "--out", str(wide)]) == 0
    grown = json.loads(wide.read_text())["trainable_params"] - result["trainable_params"]
    assert grown == 2 * 3 * 64 * (256 - 128) and "hidden 64 MLP 256 layers 2" in capsys.readouterr().out


def _hand_layer_params(H, heads, kv, d, inter):
    # q, k, v, o projections (no bias), gate/up/down, two RMSNorms of H, q_norm and k_norm of d
    return H * heads * d * 2 + H * kv * d * 2 + 3 * H * inter + 2 * H + 2 * d


def test_target_forward_runs_the_trainers_target_and_counts_flop_by_hand(tmp_path, capsys):
    target_forward = load_benchmark("benchmarks.target_forward")
    out = tmp_path / "forward.json"
    argv = ["--preset", "tiny-cpu", "--num-layers", "6", "--seq-len", "64", "--batch", "3", "--steps", "1",
            "--profile", "--out", str(out)]
    assert target_forward.main(argv) == 0
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    H, heads, kv, d, inter, L, B, T = 64, 4, 2, 16, 128, 6, 3, 64
    assert r["layer_params"] == L * _hand_layer_params(H, heads, kv, d, inter)
    layers = 2 * r["layer_params"] * B * T
    attention = L * 4 * heads * d * B * T * (T + 1) // 2     # causal: sum over queries of (i + 1) keys
    assert r["tflop_per_forward"]["layers"] * 1e12 == pytest.approx(layers)
    assert r["tflop_per_forward"]["attention"] * 1e12 == pytest.approx(attention)
    # dflash-train's default taps of a 6-layer target, each [B, T, H]; no logits, no last hidden state
    assert r["target_layer_ids"] == default_target_layer_ids(L, 5)
    assert r["taps"] == [[B, T, H]] * 5 and r["last_hidden"] is None
    assert r["tokens_per_s"] == pytest.approx(B * T / r["forward_s_median"])
    assert r["ratio_to_peak"] == pytest.approx(r["achieved_tflops"] / r["peak"]["tflops"])
    assert f"share of measured peak  {r['ratio_to_peak']:.4g}" in text
    assert sum(p["share"] for p in r["profile"]["parts"].values()) == pytest.approx(1.0)


def test_target_forward_refuses_too_few_layers_before_writing_anything(tmp_path, capsys):
    target_forward = load_benchmark("benchmarks.target_forward")
    assert target_forward.main(["--num-layers", "3", "--work-dir", str(tmp_path / "w")]) == 2
    assert "pass --num-layers 4 or more" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
@pytest.mark.parametrize("script", ["train_step", "target_forward"])
def test_cuda_asked_for_without_cuda_is_one_line_and_exit_2(script, capsys):
    bench = load_benchmark("benchmarks." + script)
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--preset", "tiny-cpu", "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and "\n" not in err and "CUDA is not available" in err and "--preset tiny-cpu" in err


@pytest.mark.parametrize("script, knob, value, error", [
    ("train_step", "DFLASH_FP8_LAYERS", "yes",
     "DFLASH_FP8_LAYERS is 'yes'; set it to auto, 0, 1 (tensorwise) or one of tensorwise, rowwise"),
    ("target_forward", "DFLASH_EAGER_TARGET", "yes", "DFLASH_EAGER_TARGET is 'yes'; set it to 0 or 1"),
    pytest.param("train_step", "DFLASH_FP8_LAYERS", "rowwise",
                 "DFLASH_FP8_LAYERS (rowwise) needs torchao; pip install 'dflash_trainer[fp8]' or unset "
                 "DFLASH_FP8_LAYERS",
                 marks=pytest.mark.skipif(importlib.util.find_spec("torchao") is not None,
                                          reason="the refusal needs torchao absent")),
])
def test_a_bad_environment_knob_is_refused_by_the_parser_before_anything_runs(script, knob, value, error,
                                                                               monkeypatch, capsys):
    monkeypatch.setenv(knob, value)
    bench = load_benchmark("benchmarks." + script)
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--preset", "tiny-cpu"])
    out = capsys.readouterr()
    assert stopped.value.code == 2 and "peak:" not in out.out  # nothing measured
    assert out.err.strip().splitlines()[-1].endswith(f": error: {error}"), out.err


def test_sdpa_backends_times_each_kv_form_and_reports_a_refusing_backend(tmp_path, capsys):
    sdpa = load_benchmark("benchmarks.sdpa_backends")
    assert sdpa.main(["--device", "cpu", "--out", str(tmp_path / "sdpa.json")]) == 0
    result = json.load(open(tmp_path / "sdpa.json"))
    assert [(r["backend"], r["kv"]) for r in result["rows"]] == [
        ("default", "enable_gqa"), ("default", "repeated"), ("MATH", "enable_gqa"), ("MATH", "repeated")]
    shape = result["shape"]
    assert result["tflop_per_call"] * 1e12 == 4 * shape["heads"] * shape["head_dim"] * 128 * 129 / 2
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in result["rows"])
    assert result["rows"][0]["max_abs_diff"] == 0  # the first row is the reference
    assert all(r["max_abs_diff"] < 1e-5 for r in result["rows"])  # the same attention by every kernel
    assert "| MATH | repeated |" in capsys.readouterr().out
    # a backend that does not take these inputs (cuDNN on the CPU) is a refusal, not a crash
    refused = sdpa.time_backend(torch, "CUDNN_ATTENTION", True, shape, torch.device("cpu"), torch.float32)
    assert isinstance(refused, str) and refused


def test_eval_workers_times_each_process_count_against_one_with_the_same_figures(tmp_path, capsys):
    bench = load_benchmark("benchmarks.eval_workers")
    assert bench.main(["--device", "cpu", "--workers", "1,2", "--out", str(tmp_path / "ew.json")]) == 0
    rows = json.load(open(tmp_path / "ew.json"))["rows"]
    assert [r["workers"] for r in rows] == [1, 2] and rows[0]["speedup"] == 1.0
    assert all(r["seconds"] > 0 and r["same_figures"] and r["lossless"] and r["num_steps"] > 0 for r in rows)
    assert "| 2 |" in capsys.readouterr().out
    assert bench.main(["--device", "cpu", "--workers", "0"]) == 2


def test_eval_replay_times_the_replay_against_the_decode_with_the_same_figures(tmp_path, capsys):
    bench = load_benchmark("benchmarks.eval_replay")
    assert bench.main(["--device", "cpu", "--out", str(tmp_path / "er.json")]) == 0
    rows = json.load(open(tmp_path / "er.json"))["rows"]
    assert [r["method"] for r in rows] == ["dflash", "prompt_lookup_n3"]
    for r in rows:
        assert r["same_figures"] and r["prompts_same_steps"] == r["num_prompts"] == 6 and r["lossless_decode"]
        assert r["decode_s"] > 0 and r["tau_decode"] == r["tau_replay"]
    assert rows[1]["tau_decode"] > 1  # the repeating prompts: prompt lookup's drafts are accepted too
    assert "| dflash |" in capsys.readouterr().out
    assert bench.main(["--device", "cpu", "--target-model", str(tmp_path)]) == 2


def test_back_to_back_calls_are_timed_together_in_order_and_so_is_the_sustained_peak():
    timing = load_benchmark("benchmarks.timing")
    calls = []
    per_call = timing.back_to_back_s(lambda i: calls.append(i) or sum(range(20000)), 5, torch.device("cpu"))
    assert calls == [0, 1, 2, 3, 4] and per_call > 0
    sustained = matmul_peak.measure_sustained_peak(torch.device("cpu"), 64, 12)
    assert sustained["tflops"] > 0 and (sustained["n"], sustained["calls"], sustained["dtype"]) == (64, 12, "float32")


def test_regeneration_times_each_kv_cache_with_the_same_greedy_answers(tmp_path, capsys):
    bench = load_benchmark("benchmarks.regeneration")
    assert bench.main(["--out", str(tmp_path / "regen.json")]) == 0
    result = json.load(open(tmp_path / "regen.json"))
    shape = bench.PRESETS["tiny-cpu"]
    assert [(r["cache"], r["attention"], r["batch"]) for r in result["rows"]] == [
        (c, a, b) for b in shape["batches"] for c in ("dynamic", "static", "static-compiled")
        for a in ("sdpa", "packed-gqa")]
    # every answer runs to the cap (EOS is the last id, away from the prompts), and every cache's and attention's
    # greedy answers are the first row's
    assert all(r["tokens"] == r["batch"] * shape["new_tokens"] and r["s"] > 0 for r in result["rows"])
    assert all(r["identical"] == 1.0 for r in result["rows"])
    out = capsys.readouterr().out
    assert "vs first" in out and "aten::" in out  # the table and the profiler's
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--caches", "paged"])
    assert stopped.value.code == 2 and "unknown --caches paged" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--attentions", "eager"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "unknown --attentions eager; choose from sdpa,packed-gqa" in err


@pytest.mark.parametrize("option, error", [
    (dict(cache="paged"), "unknown KV cache 'paged'; choose one of dynamic, static, static-compiled"),
    (dict(attention="eager"), "unknown attention 'eager'; choose one of sdpa, packed-gqa")])
def test_an_unknown_kv_cache_or_attention_is_refused_before_the_target_loads(tmp_path, option, error):
    from dflash_trainer.prep.generate import Generator
    with pytest.raises(ValueError, match=error):
        Generator(str(tmp_path / "absent"), SimpleNamespace(pad_token_id=0, eos_token_id=1), "transformers", "cpu",
                  0.0, 4, 2, 0, **option)


@pytest.mark.parametrize("padded", [False, True])
def test_packed_gqa_attends_to_the_cache_as_repeated_kv_heads_do(padded):
    """One new token per row over a KV cache (3 KV heads, 9 query heads), with and without a padding mask: the
    packed attention gives what SDPA gives over the KV heads repeated per query head."""
    from dflash_trainer.prep.packed_gqa import packed_gqa_attention
    g = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, length, dim = 4, 9, 3, 11, 8
    query = torch.randn(batch, heads, 1, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, length, dim, generator=g) for _ in range(2))
    mask = None
    if padded:  # left padding: row r's first r positions are padding
        mask = (torch.arange(length)[None, :] >= torch.arange(batch)[:, None])[:, None, None, :]
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    out, weights = packed_gqa_attention(module, query, key, value, mask, scaling=0.3)
    repeated = [t.repeat_interleave(heads // kv_heads, dim=1) for t in (key, value)]
    expected = torch.nn.functional.scaled_dot_product_attention(query, *repeated, attn_mask=mask, scale=0.3)
    assert weights is None and out.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_the_packed_attention_is_the_one_the_generators_target_runs(tmp_path):
    from dflash_trainer.prep import packed_gqa
    from dflash_trainer.prep.generate import Generator
    bench = load_benchmark("benchmarks.regeneration")
    bench.write_target(str(tmp_path), bench.PRESETS["tiny-cpu"], "cpu")
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=511)
    gen = Generator(str(tmp_path), tokenizer, "transformers", "cpu", 0.0, 3, 2, 0)  # the default
    assert gen.model.config._attn_implementation == packed_gqa.NAME
    assert Generator(str(tmp_path), tokenizer, "transformers", "cpu", 0.0, 3, 2, 0, attention="sdpa") \
        .model.config._attn_implementation == "sdpa"
