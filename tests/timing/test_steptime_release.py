"""The step model stands for V1 (0.8 and later); where the corpus measured a V0 release's MoE
layer cost apart (DeepSeek-R1 on H200, vLLM 0.7.x nightlies), it applies to V0 alone, and a V1
release on that card takes its Hopper sibling's (docs/twin.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
from kvwatch.timing.steptime import ScheduledRequest, StepConstants, StepModel

GPT_OSS = lookup_model("gpt-oss-120b")


def test_a_v0_releases_moe_cost_does_not_reach_v1() -> None:
    h100 = StepModel(GPT_OSS, lookup_gpu("h100"))
    v1 = StepModel(GPT_OSS, lookup_gpu("h200"))
    v0 = StepModel(GPT_OSS, lookup_gpu("h200"), before_v1=True)
    assert v1.moe_layer_s == h100.moe_layer_s  # the same Hopper kernels
    assert v0.moe_layer_s > 10 * v1.moe_layer_s
    batch = [ScheduledRequest(1, 2048)] * 4
    assert v0.seconds(batch) > v1.seconds(batch)
    # a card with no V0 figure of its own: V0 is its V1 figure; an override wins in either
    a100 = StepModel(GPT_OSS, lookup_gpu("a100"))
    assert StepModel(GPT_OSS, lookup_gpu("a100"), before_v1=True).moe_layer_s == a100.moe_layer_s
    given = StepConstants.with_overrides({"moe_layer_v0_s": 1e-4})
    assert StepModel(GPT_OSS, lookup_gpu("h200"), constants=given, before_v1=True).moe_layer_s \
        == pytest.approx(1e-4)  # fmt: skip


def test_the_what_if_takes_the_release_it_is_asked_for() -> None:
    def what_if(*extra: str) -> dict:  # type: ignore[type-arg]
        p = subprocess.run(
            [sys.executable, "-m", "kvwatch", "advise", "--what-if", "--model", "gpt-oss-120b",
             "--gpu", "h200", "--concurrency", "8", "--prompt-len", "1024", "--output-len",
             "256", "--json", *extra],
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        doc = json.loads(p.stdout)
        return doc[0]["what_if"] if isinstance(doc, list) else doc["what_if"]

    v1, v0 = what_if(), what_if("--vllm-version", "0.7.3")
    step = {a["load"]["at_concurrency"]["decode_step_s"] for a in (v1, v0)}
    assert len(step) == 2 and v0["load"]["at_concurrency"]["decode_step_s"] == max(step)
    assert any("runs the V0 engine" in n for n in v0["step_time_notes"])
    assert not any("V0" in n for n in v1["step_time_notes"])


def test_the_what_if_says_when_a_card_has_no_v0_figure() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "advise", "--what-if", "--model", "gpt-oss-120b",
         "--gpu", "a100", "--tp", "2", "--concurrency", "8", "--prompt-len", "1024",
         "--output-len", "256", "--json", "--vllm-version", "0.6.3"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    doc = json.loads(p.stdout)
    notes = (doc[0] if isinstance(doc, list) else doc)["what_if"]["step_time_notes"]
    assert any("no V0 figure on a100" in n for n in notes), notes
