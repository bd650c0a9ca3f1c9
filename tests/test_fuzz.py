"""Fuzzing with hypothesis, in CI: mutated real vLLM metrics, log lines, byte streams cut
anywhere, webhook receiver configs, calibration files, model configs and vLLM spec answers with
every field of every wrong type, traces of the three formats, Prometheus API answers. 2,000
cases a target in CI, fewer for the slower ones (KVWATCH_FUZZ_EXAMPLES changes it);
bench/bench_fuzz.py runs 10^5 with plain random mutations, and
`KVWATCH_FUZZ_EXAMPLES=20000 pytest -m fuzz` all of these at 10^4 and more. Marked `fuzz`
(`-m "not fuzz"` leaves them out). The command lines: tests/test_fuzz_cli.py."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvwatch.sidecar.outputs.webhooks import FIELDS, receivers_from, render
from tests.fuzzing import (
    LOG_LINES,
    METRIC_LINES,
    check_exposition,
    check_log_line,
    check_splitter,
    mutate,
)

pytestmark = pytest.mark.fuzz
EXAMPLES = int(os.environ.get("KVWATCH_FUZZ_EXAMPLES", "2000"))
_FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.randoms(use_true_random=False), st.integers(1, 40))
def test_mutated_metrics_never_crash_or_export_untruth(rng: random.Random, n: int) -> None:
    lines = rng.sample(METRIC_LINES, min(n, len(METRIC_LINES)))
    check_exposition([mutate(line, rng) if rng.random() < 0.5 else line for line in lines])


@_FUZZ
@given(st.randoms(use_true_random=False))
def test_mutated_log_lines_never_crash_or_say_the_impossible(rng: random.Random) -> None:
    check_log_line(mutate(rng.choice(LOG_LINES), rng))


@_FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=8))
def test_the_line_splitter_reassembles_any_chunking(data: bytes, cuts: list[int]) -> None:
    check_splitter(data, cuts)


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=6,
)
_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "url": st.sampled_from(["http://127.0.0.1:9/hook", "https://hooks.example/x?token=t"]),
    "format": st.sampled_from(["json", "alertmanager", "slack"]),
    "name": st.text(max_size=20),
    "secret_env": st.sampled_from([None, "HOME", "KVWATCH_FUZZ_UNSET"]),
    "timeout_s": st.floats(0.001, 300),
    "headers": st.dictionaries(st.sampled_from(["X-Token", "Authorization"]), st.text(max_size=20)),
}


@st.composite
def _receiver_item(draw: st.DrawFn) -> Any:
    item = {}
    for field in sorted(FIELDS):
        if draw(st.booleans()):
            item[field] = draw(_ANY) if draw(st.booleans()) else draw(_GOOD[field])
    if draw(st.integers(0, 9)) == 0:
        item[draw(st.text(max_size=8))] = draw(_ANY)
    return item if draw(st.integers(0, 19)) else draw(_ANY)


# a receiver config costs about five metric lines to draw: a fifth of the cases keeps the target
# near 10 s in the suite (KVWATCH_FUZZ_EXAMPLES scales it with the rest)
@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(_receiver_item(), max_size=3))
def test_receiver_configs_load_or_say_why_in_one_line(items: list[Any]) -> None:
    """Any receiver config loads into receivers httpx can send to, or is one ValueError line:
    never another exception, never a receiver whose first delivery would raise."""
    from kvwatch.sidecar.outputs.alerting import Alert, Notification

    try:
        receivers = receivers_from(items, "hooks.yaml")
        for r in receivers:
            r.secret()
    except ValueError as e:
        assert "\n" not in str(e) and str(e)
        return
    note = Notification("firing", Alert("KvwatchThrashing", {"target": "t"}, {}), 1.0)
    for r in receivers:
        body = render(note, r.format, "id", "http://sidecar")
        httpx.Request("POST", r.url, headers=r.headers, content=repr(body).encode())


_CAL_GOOD: dict[str, st.SearchStrategy[Any]] = {
    "format": st.just("kvwatch-calibration/1"),
    "model": st.text(max_size=20),
    "gpu": st.sampled_from(["h100", "cpu"]),
    "tp": st.integers(-2, 9),
    "constants": st.dictionaries(
        st.sampled_from(["hbm_efficiency", "mfu", "flops", "overlap", "speed"]),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10**20),
        max_size=4,
    ),
    "seen": st.dictionaries(
        st.sampled_from(["concurrency", "input_len", "output_len", "x"]),
        st.lists(st.floats() | st.integers(), max_size=3),
        max_size=3,
    ),
}


@st.composite
def _calibration_doc(draw: st.DrawFn) -> Any:
    doc = {}
    for key in sorted(_CAL_GOOD) + ["figures", "error", "notes", "not_pinned", "time_base"]:
        if draw(st.integers(0, 5)):
            doc[key] = (
                draw(_ANY)
                if draw(st.integers(0, 4)) == 0 or key not in _CAL_GOOD
                else (draw(_CAL_GOOD[key]))
            )
    return doc if draw(st.integers(0, 19)) else draw(_ANY)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_calibration_doc())
def test_calibration_files_load_or_say_why_in_one_line(doc: Any) -> None:
    """A calibration file (`--calibration FILE`) of any shape gives constants the step model
    runs with, or one CalibrationError line; never another exception."""
    from kvwatch.sizing.kvmath import lookup_gpu, lookup_model
    from kvwatch.timing.calibration import CalibrationError, calibration_from_json
    from kvwatch.timing.steptime import ScheduledRequest, StepError, StepModel

    try:
        cal = calibration_from_json(doc, "cal.json")
    except CalibrationError as e:
        assert "\n" not in str(e) and str(e)
        return
    try:
        m = StepModel(lookup_model("llama-3.1-8b"), lookup_gpu(cal.gpu),
                      constants=cal.step_constants())  # fmt: skip
    except StepError as e:  # a CPU calibration without its own bandwidth: one line too
        assert "\n" not in str(e)
        return
    t = m.seconds([ScheduledRequest(1, 100)] * 4)
    assert t > 0 and t == t  # finite and positive: a step that takes no time would be untruth
    cal.outside(8, 512, 128)


_ARCH_DIR = Path(__file__).resolve().parent / "data" / "architectures"
_CONFIGS = [json.loads(p.read_text()) for p in sorted(_ARCH_DIR.glob("*/config.json"))]


@st.composite
def _config_doc(draw: st.DrawFn) -> Any:
    """A real tiny config (every family the arithmetic knows) with some fields replaced by
    anything: a wrong type, a list, a negative count, a missing key."""
    doc = dict(draw(st.sampled_from(_CONFIGS)))
    for key in draw(st.lists(st.sampled_from(sorted(doc)), max_size=3)):
        if draw(st.booleans()):
            doc.pop(key, None)
        else:
            doc[key] = draw(_ANY)
    return doc


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_config_doc())
def test_model_configs_size_or_say_why_in_one_line(doc: Any) -> None:
    """A config.json of any content is sized by the arithmetic or refused in one line
    (a list where a count was expected once raised a TypeError); never another exception."""
    from kvwatch.sizing.archconfig import architecture_from_config
    from kvwatch.sizing.errors import SizingError
    from kvwatch.sizing.kvplan import PLATFORMS, Serving, plan

    try:
        arch = architecture_from_config(doc)
        p = plan(arch, Serving(1024), PLATFORMS["cuda"], 2**30)
    except SizingError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert p.num_gpu_blocks >= 0 and arch.params_total >= 0


@st.composite
def _specs_answer(draw: st.DrawFn) -> Any:
    """What the spec builder prints (or a cache file holds), with fields replaced by anything."""
    spec = {"type": draw(st.sampled_from(["FullAttentionSpec", "SlidingWindowSpec",
                                          "MLAAttentionSpec", "MambaSpec", "RSWASpec"])),
            "num_kv_heads": 2, "head_size": 64, "dtype": "uint8", "kv_quant_mode": 1,
            "sliding_window": 64, "shapes": [[3, 64], [2, 8, 8]],
            "dtypes": ["bfloat16", "float16"], "mamba_type": "MAMBA2"}  # fmt: skip
    doc: dict[str, Any] = {
        "vllm": "0.32.0",
        "layers": [{"name": f"model.layers.{i}.attn", "index": i, "spec": dict(spec)}
                   for i in range(draw(st.integers(0, 3)))],  # fmt: skip
        "model": {"params": 10, "hidden_size": 128, "num_layers": 2, "num_attention_heads": 2,
                  "dtype": "bfloat16", "probes": {"kv": "fp8_e4m3", "state": "float16"}},
    }  # fmt: skip
    targets: list[dict[str, Any]] = [doc, doc["model"], *doc["layers"],
                                     *[x["spec"] for x in doc["layers"]]]  # fmt: skip
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(targets))
        target[draw(st.sampled_from(sorted(target)))] = draw(_ANY)
    return doc if draw(st.integers(0, 19)) else draw(_ANY)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(_specs_answer())
@example(  # a state's dtypes that are not names (the fresh clone of 1eca2b7 found it)
    {"vllm": "0.32.0",
     "layers": [{"name": "model.layers.0.attn", "index": 0,
                 "spec": {"type": "MambaSpec", "num_kv_heads": 2, "head_size": 64,
                          "dtype": "uint8", "kv_quant_mode": 1, "sliding_window": 64,
                          "shapes": [[3, 64], [2, 8, 8]], "dtypes": [[], None],
                          "mamba_type": "MAMBA2"}}],
     "model": {"params": 10, "hidden_size": 128, "num_layers": 2, "num_attention_heads": 2,
               "dtype": "bfloat16", "probes": {"kv": "fp8_e4m3", "state": "float16"}}}
)  # fmt: skip
def test_vllm_spec_answers_size_or_say_why_in_one_line(doc: Any) -> None:
    """vLLM's spec builder's answer, or a cache file of it edited by anyone, gives layers the
    block arithmetic sizes, or one SizingError line; never another exception."""
    from kvwatch.sizing.errors import SizingError
    from kvwatch.sizing.vllm_layers import layers_from_answer, signature

    try:
        found = layers_from_answer(doc, "m")
        signature(found.layers)
    except SizingError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert found.layers and found.params > 0


@settings(
    max_examples=max(1, EXAMPLES // 4), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(
    fmt=st.sampled_from(["mooncake", "azure", "kvwatch"]),
    named=st.booleans(),
    rng=st.randoms(use_true_random=False),
    speed=st.sampled_from([1.0, 2.0, 0.001, 1e-300, 1e300]),
    scale=st.sampled_from([1.0, 0.25, 1e-6, 1e6]),
    speed_end=st.sampled_from([None, 4.0, 0.5, 1e-300, 1e300, 0.0, math.nan]),
)
def test_traces_of_every_format_replay_or_say_why_in_one_line(
    fmt: str,
    named: bool,
    rng: random.Random,
    speed: float,
    scale: float,
    speed_end: float | None,
    tmp_path: Path,
) -> None:
    """Rows of the three formats with hostile fields (ints past a float, zoned and naive times
    mixed, priorities past 64 bits, NaN): read and planned, or one TraceError line."""
    from tests.fuzzing import check_trace, trace_text

    path = tmp_path / f"trace.{'csv' if fmt == 'azure' else 'jsonl'}"
    path.write_text(trace_text(fmt, rng))
    check_trace(path, fmt if named else None, speed, scale, speed_end)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_prometheus_answers_advise_or_say_why_in_one_line(rng: random.Random) -> None:
    """`advise --prometheus` on any answer to each of its queries: advice for every engine it
    can read, or one SizingError/CliError line; never a traceback or a figure not finite."""
    from tests.fuzzing import check_prometheus_answers

    check_prometheus_answers(rng)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_prometheus_history_calibrates_or_says_why_in_one_line(rng: random.Random) -> None:
    """`calibrate --prometheus` on any answer to each of its range queries: figures a fit can
    take, or one SizingError/CliError line."""
    from tests.fuzzing import check_prometheus_calibration

    check_prometheus_calibration(rng)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_a_sidecars_readings_calibrate_or_say_why_in_one_line(rng: random.Random) -> None:
    """`calibrate --sidecar` reads a sidecar's /api/readings: a real one with fields given any
    value gives figures a fit can take, or one line."""
    from tests.fuzzing import check_sidecar_readings

    check_sidecar_readings(rng)


@settings(
    max_examples=max(1, EXAMPLES // 4), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_another_sidecars_state_advises_or_says_why_in_one_line(rng: random.Random) -> None:
    """`advise --sidecar` reads another sidecar's /api/state: a real one with fields given any
    value advises, or is one line."""
    from tests.fuzzing import check_sidecar_state

    check_sidecar_state(rng)


@_FUZZ
@given(
    rng=st.randoms(use_true_random=False),
    cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=12),
    want_ids=st.booleans(),
)
def test_a_streamed_answer_is_recorded_or_is_one_error_line(
    rng: random.Random, cuts: list[int], want_ids: bool
) -> None:
    """The load generator's HTTP/1.1 parser and SSE reader on a completion's answer (chunked,
    Content-Length or until close; JSON with hostile fields; cut anywhere): a record of
    counts and times a run can keep, or one error line."""
    from tests.fuzzing import check_streamed_answer, sse_response

    check_streamed_answer(sse_response(rng), cuts, want_ids)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_the_servers_one_off_answers_are_read_or_refused_in_one_line(rng: random.Random) -> None:
    """`/v1/models` (the model to load), `/tokenize` (token-exact prompts) and `/version` (the
    release the advice names) with any answer: what the server said, None, or one line."""
    from tests.fuzzing import check_server_answers

    check_server_answers(rng)


@settings(
    max_examples=max(1, EXAMPLES // 10), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_an_edited_run_directory_reports_advises_calibrates_or_says_why(
    rng: random.Random, tmp_path: Path
) -> None:
    """`kvwatch report`, `advise --run` and `calibrate --run` on a real run directory with
    fields of its files given any value: each works, or says why in one line."""
    from tests.fuzzing import check_run_dir

    check_run_dir(rng, tmp_path)


@settings(
    max_examples=max(1, EXAMPLES // 5), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_an_edited_search_file_draws_or_says_why(rng: random.Random, tmp_path: Path) -> None:
    """`kvwatch report` on a search directory with fields of search.json given any value."""
    from tests.fuzzing import check_search_file

    check_search_file(rng, tmp_path / "search")


@settings(
    max_examples=EXAMPLES, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_kv_event_batches_feed_the_curve_or_are_refused_in_one_line(rng: random.Random) -> None:
    """`sidecar --kv-events` reads vLLM's msgpack batches: spoiled fields or cut bytes give
    events the curve takes, or one line; one curve across the cases, as a sidecar keeps it."""
    from tests.fuzzing import check_kv_event_batch

    check_kv_event_batch(rng, _KV_CURVE)


def _kv_curve() -> Any:
    from kvwatch.sidecar.judge.prefix_curve import PrefixCurve

    return PrefixCurve(max_keys=64)


_KV_CURVE = _kv_curve()


@settings(
    max_examples=max(1, EXAMPLES // 4), deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
@given(rng=st.randoms(use_true_random=False))
def test_a_kv_event_recording_draws_a_curve_or_says_why_in_one_line(
    rng: random.Random, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`advise --run` reads a run's kv_events.bin: cut, flipped or padded bytes give a curve
    and what was left out, or one line."""
    from tests.fuzzing import check_kv_recording

    check_kv_recording(rng, tmp_path_factory.mktemp("kv"))


_QUANT_KEYS = ("quant_method", "bits", "w_bit", "group_size", "q_group_size", "config_groups",
               "quant_algo", "quantization", "load_in_8bit", "global_quant_config",
               "modules_to_not_convert", "ignore", "ignored_layers", "exclude")  # fmt: skip
_METHODS = ("fp8", "fbgemm_fp8", "mxfp4", "modelopt", "gptq", "awq", "bitsandbytes",
            "compressed-tensors", "quark", "something-new")  # fmt: skip


@st.composite
def _quant_doc(draw: st.DrawFn) -> Any:
    """A quantization_config of a known method with fields of any type and shape."""
    doc: dict[str, Any] = {"quant_method": draw(st.sampled_from(_METHODS) | _ANY)}
    for key in draw(st.lists(st.sampled_from(_QUANT_KEYS), max_size=4)):
        doc[key] = draw(_ANY | st.lists(st.text(max_size=40), max_size=4))
    if draw(st.booleans()):
        weights = {"num_bits": draw(_ANY), "group_size": draw(_ANY)}
        doc["config_groups"] = {"g": {"weights": weights}}
    return doc


@settings(max_examples=EXAMPLES, deadline=None)
@given(_quant_doc())
def test_quantization_configs_give_a_weight_size_or_a_note(doc: Any) -> None:
    """Any quantization_config gives a finite, positive size a parameter (at most 32 bits a
    weight and its scales), or the dtype's with a one-line note; never an exception
    (kvwatch/sizing/quantized.py)."""
    from kvwatch.sizing.archconfig import architecture_from_config
    from kvwatch.sizing.presets import MODEL_PRESETS

    cfg = dict(MODEL_PRESETS["llama-3.1-8b"].config, quantization_config=doc)
    arch = architecture_from_config(cfg, "fuzz")
    b = arch.weight_bytes_per_param
    assert 0 < b <= 4.5 and b == b, b
    assert all(isinstance(n, str) and "\n" not in n for n in arch.notes)


_STEP_FIELDS = ("end", "card_s", "requests", "prefill", "recompute", "preempted", "resumed",
                "skipped")  # fmt: skip


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_STEP_FIELDS), _ANY | st.lists(st.text(max_size=12))),
    st.binary(max_size=40),
)
def test_step_trace_lines_are_read_or_counted_and_judge_any_stall(
    fields: dict[str, Any], junk: bytes
) -> None:
    """The twin's step trace (`kvwatch twin --step-trace`) with fields of any type, and bytes
    of any kind: each line is a step or one counted bad line, and the truth of a stall is
    read from whatever steps were read (loadgen/results/stall_truth.py)."""
    import tempfile

    from kvwatch.loadgen.results.stall_truth import truth_causes
    from kvwatch.loadgen.results.step_trace import StepRecord, read_step_trace

    good = StepRecord(1.5, 0.4, 3, 100, 0, preempted=("cmpl-kvw1-main/0-0-00000000",))
    base = json.loads(good.to_json())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "steps.jsonl"
        edited = json.dumps(base | fields, default=str).encode()
        path.write_bytes(b"\n".join([good.to_json().encode(), edited, junk]))
        steps, bad = read_step_trace(path)
        with path.open(errors="replace") as f:
            lines = sum(1 for line in f if line.strip())
    assert good in steps and len(steps) + bad == lines
    rec = {"server_id": "kvw1-main/0", "stall_spans": [[0.2, 1.9]]}
    causes = truth_causes([rec], steps, 1.0)["kvw1-main/0"]
    assert len(causes) == 1 and causes[0] in ("preempted", "queue", "host", "prefill",
                                               "recompute", "unknown")  # fmt: skip


_COUNT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6).map(float)
)


@_FUZZ
@given(
    scrapes=st.lists(
        st.lists(st.tuples(st.sampled_from((0.01, 0.3, 1.0, 2.5, 80.0, math.inf, math.nan)),
                           _COUNT), max_size=8),
        min_size=1, max_size=6,
    ),
    preempted=st.floats(allow_nan=False, allow_infinity=False),
)  # fmt: skip
def test_any_itl_histogram_gives_finite_stall_seconds_or_none(
    scrapes: list[list[tuple[float, float]]], preempted: float
) -> None:
    """The server's ITL histogram, scrape after scrape, with any bounds and counts (NaN,
    infinite, negative, falling, unsorted): the tally never raises and holds finite counts
    from 0; a window it cannot read is counted."""
    from kvwatch.sidecar.judge.stall_seconds import StallTally

    tally = StallTally()
    for i, buckets in enumerate(scrapes):
        step = {"preemptions_total": preempted, "prompt_tokens_total": 1.0}
        tally.add(float(i), tuple(buckets), step)
    for c in tally.counts.values():
        assert math.isfinite(c.stalls) and c.stalls >= 0, c
        assert math.isfinite(c.seconds) and c.seconds >= 0, c
