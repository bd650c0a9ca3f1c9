"""Ask the installed vLLM for a model's KV layer specs: a child process runs
`vllm_specs.py` (vLLM's own model classes on the meta device, offline), and its answer is
cached per config and vLLM build (`$KVWATCH_CACHE/vllm-layers`): the first sizing of a config
costs vLLM's import and one meta build (about 10 s here), later ones a read.

The process half of sizing/vllm_layers.py, which turns the answer into kvwatch's layers (pure).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvwatch.local.vllm_specs import MARK

__all__ = ["vllm_installed", "vllm_answer", "run_spec_builder", "offline_vllm_env"]

_CACHE_VERSION = 2  # the builder's answer format: bump when vllm_specs.py changes it


def vllm_installed() -> Path | None:
    """vLLM's package folder when this interpreter can import it (without importing it)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent


def _cache_dir() -> Path:
    root = os.environ.get("KVWATCH_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "kvwatch") / "vllm-layers"


def _build_key(folder: Path) -> str:
    """The installed vLLM build: its folder and the time its files were installed."""
    marker = folder / "__init__.py"
    try:
        stamp = max(marker.stat().st_mtime_ns, (folder / "_version.py").stat().st_mtime_ns)
    except OSError:
        stamp = marker.stat().st_mtime_ns if marker.exists() else 0
    return f"{folder}:{stamp}"


def _key(config: Mapping[str, Any], build: str) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(f"{_CACHE_VERSION}\n{build}\n{text}".encode()).hexdigest()[:32]


def vllm_answer(config: Mapping[str, Any], timeout_s: float = 300.0) -> Any:
    """vLLM's answer for `config` (its layers and model, or `{"error": ...}`), from the cache
    or a child process; None where vLLM is not installed. The answer is input from outside
    (a cache file may have been edited): the caller checks it (sizing/vllm_layers.py)."""
    folder = vllm_installed()
    if folder is None:
        return None
    key = _key(config, _build_key(folder))
    cached = _cache_dir() / f"{key}.json"
    found: Any = None
    try:
        found = json.loads(cached.read_text())
    except (OSError, ValueError):
        found = None
    if not isinstance(found, dict):
        found = _run_child(config, timeout_s)
        if "error" not in found:
            _store(cached, found)
    return found


def _store(path: Path, found: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(found))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written costs the next run a rebuild, nothing else


def _run_child(config: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    if sys.stderr.isatty():  # the first sizing of a config takes seconds: say why
        print("kvwatch: building the model with vLLM's own classes (once per config) ...",
              file=sys.stderr, flush=True)  # fmt: skip
    return run_spec_builder({"model": dict(config)}, timeout_s)["model"]


def offline_vllm_env(log_level: str | None = None) -> dict[str, str]:
    """The environment of a child that runs vLLM in-process and offline (the spec builder,
    the tests' oracle and twin probe): one process, no hub, no usage stats, vLLM's own
    platform rather than the twin's unless the child asks for it itself."""
    env = dict(
        os.environ,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
    )
    if log_level:
        env["VLLM_LOGGING_LEVEL"] = log_level
    env.pop("KVWATCH_TWIN", None)
    return env


def run_spec_builder(
    configs: Mapping[str, Mapping[str, Any]], timeout_s: float = 300.0
) -> dict[str, dict[str, Any]]:
    """Each config's answer from one child running `vllm_specs.py` (vLLM imported once for
    all of them): its layers and model, or `{"error": ...}` in one line. Never raises."""
    env = offline_vllm_env(log_level="ERROR")
    cases = json.dumps([{"id": k, "config": v} for k, v in configs.items()], default=str)
    why = None
    found: dict[str, dict[str, Any]] = {}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kvwatch.local.vllm_specs"],
            input=cases,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        why = f"vLLM did not build the model within {timeout_s:.0f} s"
    except OSError as e:
        why = f"cannot start {sys.executable}: {e.strerror}"
    else:
        for line in proc.stdout.splitlines():
            if not line.startswith(MARK):
                continue
            try:
                item = json.loads(line[len(MARK) :])
            except ValueError:
                continue
            if isinstance(item, dict) and str(item.get("id")) in configs:
                found[str(item.pop("id"))] = item
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"vLLM's model builder exited {proc.returncode}: {tail[:120]}"
    return {k: found.get(k) or {"error": why} for k in configs}
