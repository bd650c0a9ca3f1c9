from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from kvwatch.common.backoff import backoff_s
from kvwatch.local.server import free_port
from kvwatch.sidecar.outputs.alerting import Alert, AlertTracker, Notification
from kvwatch.sidecar.outputs.webhooks import Receiver, load_receivers, redact_url, render, sign
from kvwatch.sidecar.store.firing_store import FiringStore
from kvwatch.sidecar.store.outbox import Outbox
from tests.receiver import receiver
from tests.sidecar.fakes import raw_http_server
from tests.sidecar.running import running_sidecar

ALERT = Alert(
    "KvwatchThrashing",
    {"target": "http://a", "model_name": "m", "engine": "0", "severity": "critical"},
    {"summary": "vLLM <thrashing> & more", "description": "d"},
)


class TestFormats:
    def test_alertmanager_v4(self) -> None:
        p = render(Notification("firing", ALERT, 1700000000.0), "alertmanager", "id1", "http://s")
        assert p["version"] == "4" and p["status"] == "firing"
        for key in (
            "groupKey",
            "truncatedAlerts",
            "receiver",
            "groupLabels",
            "commonLabels",
            "commonAnnotations",
            "externalURL",
            "alerts",
        ):
            assert key in p
        (a,) = p["alerts"]
        assert a["labels"]["alertname"] == "KvwatchThrashing"
        assert a["startsAt"].startswith("2023-11-14T22:13:20") and a["endsAt"].startswith("0001")
        assert set(a) >= {
            "status",
            "labels",
            "annotations",
            "startsAt",
            "endsAt",
            "generatorURL",
            "fingerprint",
        }

    def test_slack_escapes(self) -> None:
        p = render(Notification("resolved", ALERT, 0.0, 1.0), "slack", "id", "")
        assert "&lt;thrashing&gt; &amp; more" in p["text"] and "RESOLVED" in p["text"]
        assert p["blocks"][0]["text"]["type"] == "mrkdwn"

    def test_signature_covers_the_timestamp(self) -> None:
        assert sign(b"k", b"body", 1700000000) == (
            "sha256=" + __import__("hmac").new(b"k", b"1700000000.body", "sha256").hexdigest()
        )
        assert sign(b"k", b"body", 1700000000) != sign(b"k", b"body", 1700000001)


class TestReceiversConfig:
    def test_flags_and_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("HOOK_SECRET", "s3cret")
        f = tmp_path / "hooks.yaml"
        f.write_text("- url: http://x/hook\n  format: slack\n  secret_env: HOOK_SECRET\n")
        rs = load_receivers(["http://y/h,alertmanager"], f)
        assert [r.format for r in rs] == ["alertmanager", "slack"] and rs[1].secret() == b"s3cret"

    @pytest.mark.parametrize(
        ("content", "why"),
        [
            ("- url: http://x\n  format: teams\n", "format: must be one of"),
            ("- format: json\n", "needs a url"),
            ("- url: http://x\n  secret_env: NOPE_UNSET_VAR\n", "NOPE_UNSET_VAR is empty or unset"),
            ("- url: http://x\n  colour: red\n", "unknown keys"),
            ("{a: [", "not YAML"),
        ],
    )
    def test_bad_config(self, tmp_path: Path, content: str, why: str) -> None:
        f = tmp_path / "hooks.yaml"
        f.write_text(content)
        with pytest.raises(ValueError, match=why):
            load_receivers([], f)

    def test_bad_url(self) -> None:
        with pytest.raises(ValueError, match="not an http"):
            Receiver("ftp://x")
        with pytest.raises(ValueError, match="--webhook http://h/.*: url: not a valid URL"):
            load_receivers(["http://h/\n"], None)

    @pytest.mark.parametrize(
        ("field", "why"),
        [
            ("timeout_s: fast", r"receiver 0 \(r\): timeout_s: must be a number"),
            ("timeout_s: true", "timeout_s: must be a number"),
            ("timeout_s: .nan", "timeout_s: must be a number"),
            ("timeout_s: -1", "timeout_s: must be a number"),
            ("headers: {X-Token: 123}", "headers.X-Token: must be a string .*quote a number"),
            ("headers: {X-Token: [a]}", "headers.X-Token: must be a string"),
            ("headers: [X-Token]", "headers: must be a mapping"),
            ("headers: {'bad name': x}", "headers: 'bad name' is not a header name"),
            ('headers: {X-A: "a\\nb"}', "headers.X-A: must be a string of printable ASCII"),
            ("secret_env: 5", "secret_env: must name an environment variable"),
            ("format: 5", "format: must be one of"),
        ],
    )
    def test_every_field_is_checked_where_it_enters(
        self, tmp_path: Path, field: str, why: str
    ) -> None:
        """A wrong type is one line naming the receiver and the field, at start (these loaded
        fine before and stalled every delivery at the first alert)."""
        f = tmp_path / "hooks.yaml"
        f.write_text(f"- url: http://x/hook\n  name: r\n  {field}\n")
        with pytest.raises(ValueError, match=why):
            load_receivers([], f)
        for url in ("5", "[http://x]", "{a: b}", "null"):
            f.write_text(f"- url: {url}\n")
            with pytest.raises(ValueError, match="receiver 0: url: not an http"):
                load_receivers([], f)


class TestOutbox:
    def test_order_and_bound(self) -> None:
        ob = Outbox(sqlite3.connect(":memory:"), max_pending=3)
        for i in range(5):
            ob.put("r", f"m{i}".encode())
        head = ob.head("r")
        assert head is not None and head.body == b"m2"  # m0, m1 dropped
        assert ob.stats()["r"].dropped == 2
        ob.failed(head.id, "down", time.time() + 60)
        assert ob.head("r").attempts == 1  # type: ignore[union-attr]
        ob.delivered(head.id)
        assert ob.head("r").body == b"m3"  # type: ignore[union-attr]

    def test_backoff_grows_and_is_capped(self) -> None:
        rng = random.Random(0)
        d = [backoff_s(n, base=1, cap=60, rng=rng) for n in (1, 2, 3, 10)]
        assert 0.5 <= d[0] <= 1 and 1 <= d[1] <= 2 and 2 <= d[2] <= 4 and 30 <= d[3] <= 60


class TestTracker:
    def test_fire_repeat_resolve_and_restart(self, tmp_path: Path) -> None:
        db = sqlite3.connect(tmp_path / "a.db")
        t = AlertTracker(FiringStore(db), repeat_interval_s=10)
        assert [n.status for n in t.update([ALERT], 0)] == ["firing"]
        assert t.update([ALERT], 5) == []
        (rep,) = t.update([ALERT], 11)
        assert rep.repeat and rep.starts_at == 0
        t2 = AlertTracker(FiringStore(sqlite3.connect(tmp_path / "a.db")), repeat_interval_s=10)
        assert t2.update([ALERT], 12) == []  # known as firing after a restart: no re-announce
        (res,) = t2.update([], 13)
        assert res.status == "resolved" and res.ends_at == 13


def test_an_attempt_that_raises_is_a_failed_attempt_and_stalls_no_other_receiver() -> None:
    """Whatever one attempt raises (here a header httpx refuses, put past the load-time check),
    the message stays with its attempt counted and a retry planned, and the other receiver
    still gets its message."""
    import asyncio

    from kvwatch.sidecar.outputs.webhooks import deliver_forever, enqueue

    outbox = Outbox(sqlite3.connect(":memory:", check_same_thread=False))
    note = Notification("firing", ALERT, 10.0, valid_until=100.0)
    with receiver() as (url, got):
        good = Receiver(url, name="good")
        bad = Receiver(url, name="bad")
        object.__setattr__(bad, "headers", {"X-Token": 123})  # what `X-Token: 123` loaded as
        enqueue(outbox, [bad, good], [note], "http://sidecar")

        async def run() -> None:
            task = asyncio.create_task(deliver_forever(outbox, [bad, good], poll_s=0.05))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not got:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)
            assert not task.done(), "the delivery loop died"
            task.cancel()

        asyncio.run(run())
    assert [g["body"]["status"] for g in got] == ["firing"]
    head = outbox.head("bad")
    assert head is not None and head.attempts == 1 and head.next_at > time.time()
    assert outbox.head("good") is None


def _metrics_body() -> bytes:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    )
    return (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(text)) + text.encode()


@pytest.mark.integration
def test_receiver_down_and_sidecar_killed_loses_nothing(tmp_path: Path) -> None:
    """The target goes down (alert fires) while the receiver is down; the sidecar is killed with
    SIGKILL and restarted; the target comes back (alert resolves); then the receiver comes up
    and gets firing then resolved, each exactly once, signed."""
    target_port, hook_port = free_port(), free_port()
    hook = f"http://127.0.0.1:{hook_port}/hook"
    cfg = tmp_path / "hooks.json"
    cfg.write_text(json.dumps([{"url": hook, "secret_env": "KVW_TEST_SECRET"}]))
    args = [
        "--target",
        f"http://127.0.0.1:{target_port}",
        "--interval",
        "0.2",
        "--db",
        str(tmp_path / "s.db"),
        "--webhook-config",
        str(cfg),
        "--threshold",
        "target_down_after_s=0.5",
    ]
    os.environ["KVW_TEST_SECRET"] = "hush"  # the sidecar process inherits it
    try:
        with running_sidecar(args) as side:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                st = httpx.get(side + "/api/state").json()["alerting"]
                box = st["webhooks"].get(redact_url(hook), {})
                if st["firing"] and box.get("pending"):
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"alert never queued: {st}")
            side.proc.kill()
            side.proc.wait(10)
        # the target comes back on its port (a fake: only /metrics matters here), and the
        # sidecar restarts on the same database
        with raw_http_server(_metrics_body(), target_port), running_sidecar(args) as side:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                st = httpx.get(side + "/api/state").json()["alerting"]
                box = st["webhooks"].get(redact_url(hook), {})
                if not st["firing"] and box.get("pending") == 2:
                    break
                time.sleep(0.2)
            else:
                pytest.fail(f"resolve never queued: {st}")
            with receiver(hook_port) as (_, got):
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and len(got) < 2:
                    time.sleep(0.2)
                time.sleep(1.0)  # nothing more may come
    finally:
        os.environ.pop("KVW_TEST_SECRET", None)
    assert [g["body"]["status"] for g in got] == ["firing", "resolved"]
    assert [g["body"]["alertname"] for g in got] == ["KvwatchTargetDown"] * 2
    for g in got:
        stamp = int(g["headers"]["X-Kvwatch-Timestamp"])
        assert abs(time.time() - stamp) < 600
        assert g["headers"]["X-Kvwatch-Signature"] == sign(b"hush", g["raw"], stamp)
    assert len({g["headers"]["X-Kvwatch-Delivery"] for g in got}) == 2


@pytest.mark.integration
def test_an_outside_read_of_the_database_never_makes_a_restart_page_twice(
    tmp_path: Path,
) -> None:
    """Receiver down, alert fires; another process reads the database (a backup, the sqlite3
    shell); receiver up, one delivery; SIGKILL; restart: still one delivery. The sidecar's own
    open-and-close of the file dropped SQLite's locks, the reader unlinked the live WAL, and
    the delivered flag was lost: the restart sent the firing again."""
    import contextlib
    import subprocess
    import sys

    target_port, hook_port = free_port(), free_port()
    hook = f"http://127.0.0.1:{hook_port}/hook"
    db = tmp_path / "s.db"
    args = ["--target", f"http://127.0.0.1:{target_port}", "--interval", "0.2", "--db", str(db),
            "--webhook", hook, "--threshold", "target_down_after_s=0.5"]  # fmt: skip

    def box(side: str) -> dict[str, object]:
        st = httpx.get(side + "/api/state").json()["alerting"]
        return {"firing": bool(st["firing"]), **st["webhooks"].get(redact_url(hook), {})}

    def wait_for(side: str, want: dict[str, object], what: str) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(box(side).get(k) == v for k, v in want.items()):
                return
            time.sleep(0.2)
        pytest.fail(f"{what}: {box(side)}")

    with contextlib.ExitStack() as stack:
        side = stack.enter_context(running_sidecar(args))
        wait_for(side, {"firing": True, "pending": 1}, "alert never queued")
        reader = "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); "
        reader += "c.execute('SELECT COUNT(*) FROM outbox').fetchall(); c.close()"
        subprocess.run([sys.executable, "-c", reader, str(db)], check=True, timeout=30)
        _, got = stack.enter_context(receiver(hook_port))
        wait_for(side, {"pending": 0, "delivered": 1}, "never delivered")
        side.proc.kill()
        side.proc.wait(10)
        side = stack.enter_context(running_sidecar(args))
        wait_for(side, {"firing": True}, "the restart lost the firing alert")
        time.sleep(3.0)  # a resend would come within a poll or two
        assert [g["body"]["status"] for g in got] == ["firing"]
