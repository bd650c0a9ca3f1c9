"""`kvwatch twin`'s work: build the model directory, start vLLM with the twin, say what it is."""

from __future__ import annotations

import argparse
import math
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from kvwatch.common.cli_kit import EXIT_UNREACHABLE, CliError, writable_file
from kvwatch.local.server import (
    LocalVLLM,
    ServerConfig,
    ServerStartError,
    serve_until_stopped,
)
from kvwatch.sizing.budget import given_kv_bytes, human_readable_int
from kvwatch.sizing.errors import SizingError
from kvwatch.sizing.kvmath import lookup_gpu, resolve_model
from kvwatch.timing.calibration import read_calibration
from kvwatch.timing.steptime import STANDS_FOR, StepConstants, StepError
from kvwatch.twin.modeldir import EOS_ID, twin_model_dir
from kvwatch.twin.settings import ENV_VAR, SettingsError, TwinSettings

__all__ = [
    "run_twin", "TwinServer", "start_twin", "time_scale_for", "kv_bytes_for_blocks",
    "SUSTAINED_TOKENS_PER_S",
]  # fmt: skip

# What this class of machine's API server streams before it falls behind (measured on the
# 2-core development machine: saturated near 10,000 tokens/s; docs/twin.md): a load expecting
# more gets a time scale that brings it back under this.
SUSTAINED_TOKENS_PER_S = 8000.0
_CAPACITY = re.compile(r"\w+ KV cache size: [\d,]+ tokens.*")
_BUDGET = re.compile(r"kvwatch twin: KV budget (.*)")


def time_scale_for(
    expected_tokens_per_s: float | None, sustained: float = SUSTAINED_TOKENS_PER_S
) -> float:
    """The smallest whole time scale that keeps the wall token rate within what is sustained."""
    if not expected_tokens_per_s or expected_tokens_per_s <= sustained:
        return 1.0
    return float(math.ceil(expected_tokens_per_s / sustained))


@dataclass
class TwinServer:
    server: LocalVLLM
    settings: TwinSettings
    changes: tuple[str, ...]
    own_dir: Path | None = None  # the status file's directory, when start_twin made it

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def capacity_line(self) -> str | None:
        """vLLM's own capacity line, from the log."""
        return self._from_log(_CAPACITY, 0)

    def budget_line(self) -> str | None:
        """How the twin found the KV budget from --gpu-memory-utilization (None: given)."""
        return self._from_log(_BUDGET, 1)

    def _from_log(self, pattern: re.Pattern[str], group: int) -> str | None:
        """The first match among this start's lines: a log shared with an earlier twin
        (appended to) holds that twin's lines first."""
        try:
            with open(self.server.log_path, "rb") as f:
                f.seek(self.server.log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        found = pattern.search(text)
        return found.group(group) if found else None

    def stop(self) -> None:
        self.server.stop()
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)

    def __enter__(self) -> TwinServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kv_bytes_for_blocks(model: str, gpu: str, blocks: int, max_model_len: int) -> int:
    """The --kv-cache-memory-bytes that gives vLLM exactly `blocks` KV blocks for this model on
    this card (its block size and bytes per block, as vLLM lays them out)."""
    from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for

    if blocks < 1:
        raise SizingError("a KV cache needs at least one block")
    card = lookup_gpu(gpu)
    layout = layout_for(
        resolve_model(model), Serving(max_model_len=max_model_len), PLATFORMS[card.platform]
    )
    return blocks * layout.bytes_per_block


def _passed_value(args: tuple[str, ...], flag: str) -> str | None:
    """The value of `flag` among arguments passed through to vLLM (`--flag V` or `--flag=V`;
    the last one, as argparse takes it)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a.split("=", 1)[1]
    return found


def start_twin(
    model: str,
    gpu: str,
    log_path: Path,
    *,
    tp: int = 1,
    pp: int = 1,
    time_scale: float = 1.0,
    eos_probability: float = 0.0,
    seed: int = 0,
    step: dict[str, float] | None = None,
    kv_cache_dtype: str = "auto",
    vllm_args: tuple[str, ...] = (),
    port: int | None = None,
    status_dir: Path | None = None,
    start_timeout_s: float = 300.0,
    stats_interval_s: float = 1.0,
    status_interval_s: float = 5.0,
    step_trace: Path | None = None,
    cancel: threading.Event | None = None,
) -> TwinServer:
    """Start vLLM with the twin; raises SizingError/SettingsError/StepError for bad settings and
    ServerStartError when vLLM does not come up (its log's tail in the message)."""
    card = lookup_gpu(gpu)
    if card.memory_bytes is None:
        raise SizingError(f"--gpu {gpu}: the twin simulates GPUs; serve-local runs vLLM on the CPU")
    arch = resolve_model(model)
    # what vLLM refuses for this TP/PP (heads TP does not divide, a stage with no layers) is
    # refused here: the twin runs one unsharded process, where vLLM would never see it
    from kvwatch.sizing.kvplan import PLATFORMS, Serving, layout_for

    layout_for(arch, Serving(max_model_len=1, tp=tp, pp=pp), PLATFORMS[card.platform])
    for flag, why in (("--host", "the twin listens on 127.0.0.1 only"),
                      ("--port", "give kvwatch twin --port, which it waits on")):  # fmt: skip
        if _passed_value(vllm_args, flag) is not None or flag in vllm_args:
            # vLLM took them: --host 0.0.0.0 listened on every interface under a 127.0.0.1
            # URL, and --port N left the start waiting on another port for 300 s
            raise SizingError(f"{flag} cannot be passed through to the twin's vLLM: {why}")
    given = _passed_value(vllm_args, "--kv-cache-memory-bytes")
    if given is not None:
        # the twin allocates nothing, so vLLM would plan any budget: 1 PB made 477M blocks
        given_kv_bytes(human_readable_int(given), card)
    StepConstants.with_overrides(step or {})  # refused here, not in vLLM's engine process
    served = twin_model_dir(model)
    own_dir = None if status_dir else Path(tempfile.mkdtemp(prefix="kvwatch-twin-"))
    try:  # settings refused below leave no folder behind
        status = (status_dir or own_dir or Path()) / "card.json"
        settings = TwinSettings(
            model=model if not Path(model).exists() else str(Path(model).resolve()),
            gpu=card.name,
            tp=tp,
            pp=pp,
            time_scale=time_scale,
            eos_probability=eos_probability,
            sample_vocab=served.vocab,
            eos_token_id=EOS_ID,
            seed=seed,
            status_path=str(status),
            status_interval_s=status_interval_s,
            step=dict(step or {}),
            step_trace_path=None if step_trace is None else str(step_trace.resolve()),
        )
        config = ServerConfig(
            model=served.path,
            kv_cache_memory_bytes=None,
            block_size=None,
            max_model_len=None,
            port=port,
            served_model_name=arch.name,
            stats_interval_s=stats_interval_s,
            extra_args=("--kv-cache-dtype", kv_cache_dtype, *vllm_args),
            env={ENV_VAR: settings.to_env()},
            weightless=True,
        )
        twin = TwinServer(
            LocalVLLM(config, log_path=log_path, start_timeout_s=start_timeout_s, cancel=cancel),
            settings,
            served.changes,
            own_dir,
        )
    except BaseException:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        raise
    try:
        twin.server.start()
    except BaseException:
        twin.stop()
        raise
    return twin


def run_twin(ns: argparse.Namespace) -> int:
    extra = tuple(a for a in ns.vllm_args if a != "--") if ns.vllm_args else ()
    scale = ns.time_scale if ns.time_scale is not None else time_scale_for(ns.expect_tokens_per_s)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    log = writable_file(ns.log.resolve(), "the server log")
    trace = None
    if getattr(ns, "step_trace", None) is not None:
        trace = writable_file(ns.step_trace.resolve(), "the step trace")
    step = dict(ns.step)
    step_line = f"step_time=the step model's corpus fit, for {STANDS_FOR} (docs/twin.md)"
    if getattr(ns, "calibration", None) is not None:
        try:
            cal = read_calibration(ns.calibration)
            gpu = lookup_gpu(ns.gpu).name
        except SizingError as e:
            raise CliError(str(e)) from None
        if cal.gpu != gpu:
            raise CliError(f"{ns.calibration} calibrates {cal.gpu}, not {gpu}")
        step = {**cal.constants, **step}  # a --step given beside it wins
        step_line = f"step_time=calibration {ns.calibration} ({cal.source})"
    print(f"starting vLLM with the kvwatch twin (log: {log}) ...", file=sys.stderr)
    try:
        twin = start_twin(
            ns.model,
            ns.gpu,
            log,
            tp=ns.tp,
            pp=ns.pp,
            time_scale=scale,
            eos_probability=ns.eos_probability,
            seed=ns.seed,
            step=step,
            kv_cache_dtype=ns.kv_cache_dtype,
            vllm_args=extra,
            port=ns.port,
            start_timeout_s=ns.start_timeout,
            step_trace=trace,
        )
    except (SizingError, SettingsError, StepError) as e:
        raise CliError(str(e)) from None
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    s = twin.settings
    budget = twin.budget_line()
    lines = (
        f"twin={s.model} on {s.gpu} TP{s.tp} PP{s.pp} (simulated; vLLM's own engine)",
        f"time_scale={s.time_scale:g}",
        step_line,
        *(f"note=the model is {c}" for c in twin.changes),
        *((f"kv_budget={budget}",) if budget else ()),
        f"capacity={twin.capacity_line() or '(not in the log)'}",
    )
    try:
        serve_until_stopped(twin.server, lines)
    except ServerStartError as e:
        raise CliError(str(e), EXIT_UNREACHABLE) from None
    finally:
        twin.stop()  # the status directory too (the server is stopped already)
    return 0
