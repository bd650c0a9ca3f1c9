"""The state's views read back from another sidecar's /api/state: input from outside."""

from __future__ import annotations

import json

import pytest

from kvwatch.sidecar.metrics.exposition import parse_exposition
from kvwatch.sidecar.metrics.scrape import ScrapeOutcome
from kvwatch.sidecar.state.sidecar_state import SidecarState
from kvwatch.sidecar.state.views import engines_from_json, state_json
from tests.sidecar.fakes import vllm_body


class TestAnotherSidecarsState:
    """`engines_from_json` reads another sidecar's /api/state: input from outside."""

    def _doc(self, **signals: object) -> dict[str, object]:
        state = SidecarState(["http://a"])
        for t in (1.0, 2.0):
            state.record_scrape("http://a", t, ScrapeOutcome(0.01, parse_exposition(vllm_body())))
        doc = json.loads(json.dumps(state_json(state.view(2.0))))
        doc["targets"][0]["engines"][0]["signals"].update(signals)
        return doc

    def test_round_trip(self) -> None:
        ((target, e),) = engines_from_json(self._doc())
        assert target == "http://a" and e.signals.capacity_blocks == 40 and e.present

    @pytest.mark.parametrize(
        "bad",
        [{"capacity_blocks": float("inf")}, {"capacity_blocks": 40.5}, {"kv_usage": "half"},
         {"preemptions_observed": None}, {"counter_resets": True}],
    )  # fmt: skip
    def test_a_wrong_field_is_a_clear_error(self, bad: dict[str, object]) -> None:
        with pytest.raises(ValueError, match="EngineSignals"):
            engines_from_json(self._doc(**bad))

    def test_engines_not_a_list_or_episodes_not_a_count_are_clear_errors(self) -> None:
        """Found by tests/fuzzing.py's /api/state target: TypeError ('float' object is not
        iterable) and OverflowError (int(inf)) where one line was due."""
        doc = self._doc()
        doc["targets"][0]["engines"] = 1.5
        with pytest.raises(ValueError, match="engines is not a list"):
            engines_from_json(doc)
        doc = self._doc()
        doc["targets"][0]["engines"][0]["episodes"] = float("inf")
        with pytest.raises(ValueError, match="episodes inf is not a count"):
            engines_from_json(doc)


def test_the_fleets_prefix_figures_are_reused_for_a_few_seconds() -> None:
    """Their set union walks every replica's cached blocks: not on every view."""
    from kvwatch.sidecar.kvevents.sequence import FeedStats
    from kvwatch.sidecar.kvevents.wire import Batch, Stored, block_key
    from kvwatch.sidecar.state.sidecar_state import FLEET_PREFIX_REFRESH_S

    state = SidecarState(["http://a", "http://b"])
    for url in ("http://a", "http://b"):
        state.follow_kv_events(url, FeedStats())
        for t in (1.0, 2.0):
            state.record_scrape(url, t, ScrapeOutcome(0.01, parse_exposition(vllm_body())))
    two = Stored((block_key(0, 1), block_key(0, 2)), None)
    state.record_kv_batch("http://a", Batch(1.0, (two,), 0))
    first = state.view(10.0).fleet_prefix
    assert first is not None and first.cached_blocks == 2
    state.record_kv_batch("http://b", Batch(2.0, (two,), 0))
    assert state.view(10.0 + FLEET_PREFIX_REFRESH_S / 2).fleet_prefix is first
    later = state.view(10.0 + FLEET_PREFIX_REFRESH_S).fleet_prefix
    assert later is not None and later.cached_blocks == 4 and later.duplicated_share == 0.5
    assert state.view(9.0).fleet_prefix is not later  # a clock that went back: anew
