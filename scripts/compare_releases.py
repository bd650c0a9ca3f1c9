"""Print the table of what differs between the recorded releases (tests/data/releases/), for
docs/log-formats.md: which metric families each exports and how its log words things.

    .venv/bin/python scripts/compare_releases.py
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tests" / "data" / "releases"
FAMILIES = (
    "kv_cache_usage_perc", "gpu_cache_usage_perc", "num_preemptions_total",
    "request_num_preemptions", "num_requests_waiting_by_reason", "prompt_tokens_by_source_total",
    "admission_rejections_total", "request_prefill_kv_computed_tokens", "engine_sleep_state",
)  # fmt: skip
LOG = (
    ("stats line device", r"(\w+) KV cache usage: "),
    ("stats prefix", r"(Engine \d+: )Avg prompt"),
    ("capacity line", r"(\w+ KV cache size: [\d,]+ tokens)"),
    ("banner", r"(version \d[\w.]*|vLLM API server version \S+)"),
    ("stop asked for", r"(shutdown triggered|received signal=SIGTERM|Shutdown initiated)"),
)


def _sort_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def main() -> None:
    versions = sorted((p.name for p in ROOT.iterdir() if p.is_dir()), key=_sort_key)
    rows = [["", *versions]]
    bodies = {v: (ROOT / v / "metrics-04-after.txt").read_text() for v in versions}
    logs = {v: (ROOT / v / "vllm.log").read_text(errors="replace") for v in versions}
    for fam in FAMILIES:
        rows.append([f"`vllm:{fam}`"] + [
            "yes" if re.search(rf"^vllm:{fam}(_bucket)?[{{ ]", bodies[v], re.M) else "-"
            for v in versions
        ])  # fmt: skip
    cache = {v: re.search(r"^vllm:cache_config_info\{(.*)\}", bodies[v], re.M) for v in versions}
    rows.append(["`cache_config_info` labels"] + [
        str(len(re.findall(r'(\w+)="', m[1]))) if (m := cache[v]) else "-" for v in versions
    ])  # fmt: skip
    for name, rx in LOG:
        cells = []
        for v in versions:
            m = re.search(rx, logs[v])
            cells.append(f"`{m[1].strip()}`" if m else "-")
        rows.append([name, *cells])
    rows.append(["ANSI-coloured prefix"] + ["yes" if "\x1b[" in logs[v] else "-" for v in versions])
    rows.append(["preemptions in the load"] + [
        re.search(r"^vllm:num_preemptions_total\{.*\} (\S+)$", bodies[v], re.M)[1]  # type: ignore[index]
        for v in versions
    ])  # fmt: skip
    for r in rows[:1]:
        print("| " + " | ".join(r) + " |")
        print("|" + "---|" * len(r))
    for r in rows[1:]:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
