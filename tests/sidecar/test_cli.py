"""`kvwatch logs` and the sidecar's argument errors, as a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.sidecar.logs.test_logformats import V0_STATS, V0_WARNING


def kvwatch(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", *args], input=stdin, capture_output=True, timeout=60
    )


class TestLogsCommand:
    def test_real_log_summary(self, data_dir: Path) -> None:
        p = kvwatch("logs", str(data_dir / "vllm-0.32-cpu-server.log"))
        assert p.returncode == 0, p.stderr
        out = p.stdout.decode()
        assert "1,280 tokens of KV (CPU)" in out and "1.25x concurrency" in out
        assert "11-29 09:02" in out and "100%" in out

    def test_v0_log_from_stdin_counts_repeat_victims(self) -> None:
        other = V0_WARNING.replace("cmpl-8f3c2a9e4b1d4f7a-0", "cmpl-aa-0").replace("=51", "=101")
        log = "\n".join([V0_WARNING, V0_STATS, other, V0_WARNING.replace("=51", "=151")])
        p = kvwatch("logs", "-", stdin=log.encode() + b"\n\xff\xfe garbage\n")
        assert p.returncode == 1  # preemptions: something went wrong
        out = p.stdout.decode()
        assert (
            "3 warnings, cumulative count 151" in out
            and "1 request(s) warned more than once" in out
        )

    def test_json_events_then_summary(self, data_dir: Path) -> None:
        p = kvwatch("logs", "--json", str(data_dir / "vllm-0.32-cpu-server.log"))
        rows = [json.loads(x) for x in p.stdout.decode().splitlines()]
        kinds = [r["kind"] for r in rows]
        assert kinds[:3] == ["server_start", "server_start", "capacity"] and kinds[-1] == "summary"
        assert rows[0]["version"] == "0.32.0" and rows[-1]["vllm_version"] == "0.32.0"
        assert rows[-1]["lines"] == 239 and sum(r["kind"] == "stats" for r in rows) == 39

    def test_missing_file_is_a_clear_error(self, tmp_path: Path) -> None:
        p = kvwatch("logs", str(tmp_path / "nope.log"))
        assert p.returncode == 2 and b"cannot read" in p.stderr and b"Traceback" not in p.stderr

    def test_ten_megabyte_line(self, tmp_path: Path) -> None:
        f = tmp_path / "big.log"
        f.write_bytes(b"A" * 10_000_000 + b"\n" + V0_STATS.encode() + b"\n")
        p = kvwatch("logs", "--json", str(f))
        assert p.returncode == 0
        assert json.loads(p.stdout.decode().splitlines()[0])["kind"] == "stats"

    def test_a_file_without_newlines_is_read_in_bounded_memory(self) -> None:
        """It grew one buffer without limit and copied it on every read (quadratic)."""
        import io
        import tracemalloc

        from kvwatch.sidecar.logs.follow import FollowStats, read_line_chunks

        class NoNewlines(io.RawIOBase):
            def __init__(self, size: int) -> None:
                self.left = size

            def readable(self) -> bool:
                return True

            def readinto(self, b: bytearray) -> int:  # type: ignore[override]
                n = min(len(b), self.left)
                b[:n] = b"A" * n
                self.left -= n
                return n

        stats = FollowStats()
        tracemalloc.start()
        try:
            tail = list(read_line_chunks(io.BufferedReader(NoNewlines(64 << 20)), stats))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert tail == [] and stats.bytes == 64 << 20 and stats.oversized_lines == 1
        assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB for a 64 MiB line"

    def test_a_read_error_mid_file_is_one_line(self) -> None:
        p = kvwatch("logs", "/proc/self/mem")  # opens, then every read fails (EIO)
        assert p.returncode == 2 and b"Traceback" not in p.stderr
        assert p.stderr.decode().startswith("kvwatch: error: cannot read /proc/self/mem past byte")


class TestSidecarArgs:
    def test_bad_listen(self) -> None:
        p = kvwatch("sidecar", "--target", "http://x", "--listen", "nope")
        assert p.returncode == 2 and b"HOST:PORT" in p.stderr

    def test_log_and_command_together(self) -> None:
        p = kvwatch("sidecar", "--target", "http://x", "--log", "f", "--", "true")
        assert p.returncode == 2 and b"not both" in p.stderr

    def test_a_db_that_is_not_a_database_is_left_as_it_is(self, tmp_path: Path) -> None:
        """It was chmod'ed to 0600 first, then a sqlite3.DatabaseError traceback."""
        notes = tmp_path / "notes.txt"
        notes.write_text("my notes, not a database\n")
        notes.chmod(0o644)
        p = kvwatch("sidecar", "--target", "http://x", "--db", str(notes))
        assert p.returncode == 2 and b"Traceback" not in p.stderr
        assert p.stderr.decode().strip().splitlines() == [
            f"kvwatch: error: --db {notes}: not an SQLite database (left as it is; point --db "
            "at a new file)"
        ]
        assert notes.read_text() == "my notes, not a database\n"
        assert notes.stat().st_mode & 0o777 == 0o644
        for bad, why in ((tmp_path, "a directory"), (notes / "db", "is not a directory")):
            p = kvwatch("sidecar", "--target", "http://x", "--db", str(bad))
            assert p.returncode == 2 and why in p.stderr.decode(), p.stderr

    def test_a_model_it_cannot_read(self, tmp_path: Path) -> None:
        p = kvwatch("sidecar", "--target", "http://x", "--model", "no-such-model")
        assert p.returncode == 2 and b"--model: unknown model" in p.stderr
        bad = tmp_path / "config.json"
        odd = {"architectures": ["OddForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8,
               "num_attention_heads": 2, "kv_lora_rank": 4}  # fmt: skip
        bad.write_text(json.dumps(odd))
        p = kvwatch("sidecar", "--target", "http://x", "--model", str(bad))
        assert p.returncode == 2 and b"OddForCausalLM" in p.stderr and b"Traceback" not in p.stderr

    def test_help_explains(self) -> None:
        p = kvwatch("sidecar", "--help")
        assert p.returncode == 0 and b"--target" in p.stdout and b"examples" in p.stdout
