"""`kvwatch advise --what-if` from the command line: vLLM's figures under vLLM's names, the seed's
costs by default, and clear refusals. The CPU figures are those vLLM itself printed for the same
configs (tests/sizing/test_oracle.py, tests/sizing/test_advice_proven_swa.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ARCH = Path(__file__).resolve().parents[1] / "data" / "architectures"


def what_if(*args: str) -> tuple[int, str, str]:
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--what-if", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return p.returncode, p.stdout, p.stderr


def what_if_json(*args: str) -> tuple[int, dict[str, Any]]:
    rc, out, err = what_if(*args, "--json")
    assert rc in (0, 1), err
    (item,) = json.loads(out)
    return rc, item


def test_the_seed_figures_come_out_by_default() -> None:
    rc, out, err = what_if(
        "--model", "llama-3.1-8b", "--gpu", "h100", "--max-model-len", "8192",
        "--concurrency", "100", "--prompt-len", "1000", "--output-len", "500",
    )  # fmt: skip
    assert rc == 0, err
    for figure in (
        "128 KiB per token",
        "2.00 MiB per block",
        "6.25 new blocks per decode step",
        "24.1 TFLOP = 24 ms at peak",
        "94 blocks = 188 MiB, 3.1 ms each way",
        "generating it again: 7.2 s (4.8 ms a step",
        "16.1 GB of weights per step / 3.35 TB/s",
    ):
        assert figure in out, figure


def test_vllm_names_in_the_json() -> None:
    rc, item = what_if_json(
        "--model", "gpt-oss-120b", "--gpu", "h200", "--tp", "2",
        "--kv-cache-memory-bytes", str(40 * 2**30), "--max-model-len", "32768",
    )  # fmt: skip
    w = item["what_if"]
    assert rc == 0 and "advice" not in item
    assert {"num_gpu_blocks", "kv_cache_size_tokens", "max_concurrency"} <= w.keys()
    # 18 sliding + 18 full layers, 4 KV heads a rank: pages of 16 x 4 x 128 x 2 B x 18 layers
    assert w["bytes_per_block"] == 16 * 4 * 128 * 2 * 18
    assert w["num_gpu_blocks"] == 40 * 2**30 // w["bytes_per_block"]
    assert w["capacity_line"].startswith("GPU KV cache size: ")
    assert w["layers"] == {"sliding 128": 18, "full": 18}


@pytest.mark.parametrize(
    ("config", "blocks", "tokens", "concurrency"),
    [("mistral", 26, 3803, 3.7142857142857144), ("gemma3", 80, 4096, 4.0),
     ("qwen3next", 53, 6030, 5.888888888888889), ("deepseekv2", 94, 1504, 1.46875)],
)  # fmt: skip
def test_cpu_equals_what_vllm_printed(
    config: str, blocks: int, tokens: int, concurrency: float
) -> None:
    _, item = what_if_json(
        "--model", str(ARCH / config), "--gpu", "cpu", "--kv-cache-memory-bytes", "10485760",
        "--max-model-len", "1024", "--max-num-batched-tokens", "512", "--layers", "kvwatch",
    )  # fmt: skip
    w = item["what_if"]
    assert (w["num_gpu_blocks"], w["kv_cache_size_tokens"]) == (blocks, tokens)
    assert w["max_concurrency"] == pytest.approx(concurrency)


def test_a_load_on_a_sliding_window_model_counts_windows() -> None:
    rc, item = what_if_json(
        "--model", "gemma-3-27b", "--gpu", "h100", "--tp", "2", "--max-model-len", "16384",
        "--concurrency", "64", "--prompt-len", "6000", "--output-len", "2000",
    )  # fmt: skip
    a = item["advice"]
    # 8,000 tokens: 500 blocks in the full group, 65 or 66 in each of the 6 sliding groups
    held = next(x for x in a["arithmetic"] if x.startswith("a request of"))
    assert "500 (full)" in held and held.count("(sliding 1024)") == 6
    assert item["what_if"]["victim"]["swap_blocks"] < 500 + 6 * 66 + 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "llama-3.1-8b", "--gpu", "cpu"), "--kv-cache-memory-bytes"),
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--concurrency", "3"), "all of"),
        (("--model", "llama-3.1-405b", "--gpu", "h100"), "do not fit"),
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--kv-cache-memory-bytes", "1000000000"),
         "refuses to start"),
        (("--model", "llama-3.1-8b", "--gpu", "cpu", "--kv-cache-memory-bytes", "99999999",
          "--block-size", "16"), "multiple of 32"),
        (("--model", "nope", "--gpu", "h100"), "unknown model"),
        # what vLLM refuses before it plans (accepted until now: "0.0 GB of weights")
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "3"), "not divisible"),
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1000"), "not divisible"),
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--pp", "64"), "stage without"),
        (("--model", "llama-3.1-8b", "--gpu", "h100", "--kv-cache-memory-bytes",
          "200000000000"), "more than the h100"),
        (("--gpu", "h100",), "needs --model"),
    ],
)  # fmt: skip
def test_refusals_are_one_line(args: tuple[str, ...], message: str) -> None:
    rc, out, err = what_if(*args)
    assert rc == 2 and message in err and "Traceback" not in err, err


def test_sliding_window_models_say_what_the_pool_holds_once_requests_decode() -> None:
    """vLLM's startup concurrency counts a prefill chunk in every window; once requests decode a
    window holds only itself. Other planners print the second figure: say both."""
    args = ("--gpu", "h200", "--max-model-len", "131072")
    _, gemma = what_if_json("--model", "gemma-3-27b", *args)
    w = gemma["what_if"]
    # held while decoding at 131,072 tokens: a full group all of it, a window group its window
    held = sum(131072 // 16 if g["kind"] == "full" else 1024 // 16 for g in w["groups"])
    assert held == 8192 + 6 * 64
    assert w["decode_concurrency"] == pytest.approx(w["num_gpu_blocks"] / held)
    assert w["decode_concurrency"] > 1.5 * w["max_concurrency"]
    _, out, _ = what_if("--model", "gemma-3-27b", *args)
    assert f"once every request decodes: {w['decode_concurrency']:.2f}x 131,072-token" in out
    assert "(8,576 blocks each" in out
    _, llama = what_if_json("--model", "llama-3.1-8b", *args)
    assert llama["what_if"]["decode_concurrency"] == pytest.approx(
        llama["what_if"]["max_concurrency"], rel=1e-3
    )  # full attention: the two are one figure
    assert "once every request decodes" not in what_if("--model", "llama-3.1-8b", *args)[1]


def test_an_unknown_architecture_is_refused_in_one_short_line(tmp_path: Path) -> None:
    """No figure for an architecture the arithmetic does not know (vLLM's own layers are the
    way to one: `--layers vllm`, tests/sizing/test_vllm_layers.py)."""
    cfg = json.loads((ARCH / "llama" / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(dict(cfg, architectures=["OddForCausalLM"], multi_query=True))
    )
    rc, out, err = what_if("--model", str(tmp_path), "--gpu", "h100", "--layers", "kvwatch")
    assert rc == 2 and out == "" and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "OddForCausalLM" in line and "vLLM" in line and len(line) < 200
    _, item = what_if_json("--model", "llama-3.1-8b", "--gpu", "h100")
    assert item["what_if"]["layers_source"] == "kvwatch arithmetic"
