"""`kvwatch loadgen search` finding the SLO limit on the real vLLM fixture (the tiny model on
CPU, 40 blocks of 32 tokens), and its answer checked by rerunning it with new prompts.

480 + 120-token requests end at 19 blocks: two fit in 39, a third waits for room, so a TTFT
limit between a prefill and a prefill plus part of a request's time is met at two in flight and
missed at three. The search must find 2 and 3, name the cache as the limit that binds, and the
reruns must meet the SLO at 2 and miss it at 3; the capacity page is checked in a real browser.
This was a CI test (two minutes of load); CI keeps the KV-onset search
(tests/loadgen/test_search_live.py). Prints the probes and the reruns; the result lands in
bench/results/search-fixture.json and docs/loadgen.md.

    PYTHONPATH=. .venv/bin/python bench/bench_search_fixture.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from kvwatch.local.server import LocalVLLM, ServerConfig
from kvwatch.local.tiny_model import build_tiny_model
from tests.loadgen.test_search_live import slo_limit_holds_when_rerun

HERE = Path(__file__).resolve().parent


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="kvwatch-search-") as tmp:
        work = Path(tmp)
        # the test session's server: 40 blocks of 32 tokens, niced as beside a GPU
        with LocalVLLM(ServerConfig(model=build_tiny_model(), nice=10),
                       log_path=work / "vllm.log") as server:  # fmt: skip
            began = time.monotonic()
            out = slo_limit_holds_when_rerun(server.base_url, work)
            took = time.monotonic() - began
    doc = out["search"]
    row = {
        "date": time.strftime("%Y-%m-%d"),
        "seconds": round(took),
        "probes": [(p["load"], p["attained"], p["requests"], p["preemptions"])
                   for p in doc["probes"]],
        "max_ok": doc["result"]["max_ok"]["load"],
        "min_fail": doc["result"]["min_fail"]["load"],
        "binding": doc["result"]["binding"],
        "rerun_at_max_attainment": out["rerun_at_max"]["slo_attainment"],
        "rerun_above_attainment": out["rerun_above"]["slo_attainment"],
    }  # fmt: skip
    print(json.dumps(row, indent=1))
    (HERE / "results" / "search-fixture.json").write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
