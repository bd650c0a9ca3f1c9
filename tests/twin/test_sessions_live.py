"""Sessions on the twin: every turn resends the conversation in exact tokens, so vLLM's prefix
cache serves exactly the whole blocks that earlier turns computed (docs/loadgen.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.twin.serve import TwinServer

pytestmark = pytest.mark.integration


def test_each_turn_is_served_from_the_cache_its_conversation_left(
    twin: TwinServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "loadgen", "run", "--url", twin.base_url,
         "--sessions", "--concurrency", "4", "--requests", "4", "--turns", "3",
         "--input-len", "500", "--turn-input-len", "50", "--output-len", "40",
         "--seed", "7", "--run-dir", str(run), "--no-progress"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "4 sessions" in p.stdout
    summary = json.loads((run / "summary.json").read_text())
    turns = summary["sessions"]["turns"]
    assert [turns[k]["prompt_tokens_mean"] for k in ("0", "1", "2")] == [500, 590, 680]
    # turn 1 finds 539 tokens of KV (500 + 40, less the answer's last token): 33 blocks of 16;
    # turn 2 finds 629: 39 blocks. Exact only if the answers went back as the server's ids.
    assert summary["server"]["prompt_tokens_cached"] == 4 * (33 + 39) * 16
