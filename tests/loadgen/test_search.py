"""The capacity search's strategy, against simulated servers (pure; no probe is run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvwatch.loadgen.search import CapacitySearch, ProbeResult, SearchPlan, wilson


def _drive(
    plan: SearchPlan,
    attainment: Callable[[float], float],
    preemptions: Callable[[float], float],
    requests: int = 40,
    limit: int = 60,
) -> CapacitySearch:
    """Run the search to its end, each probe answered by the simulated server."""
    s = CapacitySearch(plan)
    for _ in range(limit):
        load = s.next_load()
        if load is None:
            return s
        ok = round(attainment(load) * requests)
        s.record(ProbeResult(load, requests, ok, preemptions(load), 10.0))
    raise AssertionError(f"the search did not end in {limit} probes: {s.probes}")


def _kv_bound(load: float) -> float:
    return 1.0 if load <= 5 else 0.5  # victims of preemption miss the SLO


def _preempts_from_4(load: float) -> float:
    return 0.0 if load < 4 else 3.0 * load


def test_wilson_is_honest_at_the_edges() -> None:
    lo, hi = wilson(40, 40)
    assert hi == 1.0 and 0.9 < lo < 0.92
    assert wilson(0, 10)[0] == 0.0
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=0.001) and hi == pytest.approx(0.596, abs=0.001)


def test_concurrency_brackets_then_bisects_to_neighbours() -> None:
    s = _drive(SearchPlan("concurrency", repeats=1, max_repeats=1), _kv_bound, _preempts_from_4)
    r = s.result()
    assert r.max_ok is not None and r.max_ok.load == 5
    assert r.min_fail is not None and r.min_fail.load == 6
    assert r.onset is not None and r.onset.load == 4
    assert r.clean is not None and r.clean.load == 3
    assert r.binding == "kv cache"
    # doubling 1, 2, 4, 8; bisection 6, 5; the onset between 2 and 4: 3
    assert [p.load for p in s.probes] == [1, 2, 4, 8, 6, 5, 3]


def test_slos_failing_on_a_cache_that_never_ran_out_is_compute() -> None:
    s = _drive(
        SearchPlan("concurrency", repeats=1, max_repeats=1),
        lambda c: 1.0 if c <= 10 else 0.0,
        lambda c: 0.0 if c < 20 else 5.0,
    )
    r = s.result()
    assert (r.max_ok and r.max_ok.load, r.min_fail and r.min_fail.load) == (10, 11)
    assert r.binding == "compute"
    # the search goes no higher than the SLO limit: the onset lies above all it probed
    assert r.onset is None and r.clean is not None and r.clean.load == 16


def test_rate_bisects_to_the_precision() -> None:
    s = _drive(
        SearchPlan("rate", start=1.0, precision=0.05, repeats=1, max_repeats=1),
        lambda r: 1.0 if r <= 3.3 else 0.2,
        lambda r: 0.0,
    )
    r = s.result()
    assert r.max_ok is not None and r.min_fail is not None
    assert r.max_ok.load <= 3.3 < r.min_fail.load
    assert r.min_fail.load - r.max_ok.load <= 0.05 * r.min_fail.load
    assert r.onset is None and r.binding == "compute"


def test_an_undecided_load_is_probed_again_up_to_the_limit() -> None:
    # 39 of 40 is 97.5%: above 95%, but the interval (0.87, 1.0) straddles it
    s = CapacitySearch(SearchPlan("concurrency", repeats=2, max_repeats=3))
    for _ in range(2):
        assert s.next_load() == 1
        s.record(ProbeResult(1, 40, 39, 0.0, 10.0))
    assert s.next_load() == 1  # still undecided after two: a third
    s.record(ProbeResult(1, 40, 39, 0.0, 10.0))
    assert s.next_load() == 2  # the limit: judged on its point estimate, 97.5%


def test_a_decided_load_is_not_probed_again() -> None:
    s = CapacitySearch(SearchPlan("concurrency", repeats=2, max_repeats=4))
    for _ in range(2):
        s.record(ProbeResult(1, 60, 60, 0.0, 10.0))
    assert s.verdicts()[0].decided(0.95)  # 120 of 120: the interval is above 0.95
    assert s.next_load() == 2


def test_when_even_the_start_fails_it_halves_down() -> None:
    s = _drive(
        SearchPlan("rate", start=8.0, repeats=1, max_repeats=1),
        lambda r: 1.0 if r <= 1.5 else 0.0,
        lambda r: 0.0,
    )
    r = s.result()
    assert [p.load for p in s.probes][:3] == [8.0, 4.0, 2.0]
    assert r.max_ok is not None and r.max_ok.load <= 1.5 < r.min_fail.load  # type: ignore[union-attr]


def test_no_load_meets_the_slo() -> None:
    s = _drive(SearchPlan("concurrency", repeats=1, max_repeats=1), lambda c: 0.0, lambda c: 0.0)
    r = s.result()
    assert r.max_ok is None and r.min_fail is not None and r.min_fail.load == 1
    assert [p.load for p in s.probes] == [1]


def test_the_maximum_is_reached_without_a_failure() -> None:
    s = _drive(
        SearchPlan("concurrency", max_load=16, repeats=1, max_repeats=1),
        lambda c: 1.0,
        lambda c: 0.0,
    )
    r = s.result()
    assert r.min_fail is None and r.max_ok is not None and r.max_ok.load == 16
    assert r.binding is None


def test_unknown_preemptions_are_no_onset_and_no_clean_load() -> None:
    s = _drive(SearchPlan("concurrency", repeats=1, max_repeats=1), _kv_bound, lambda c: None)  # type: ignore[arg-type,return-value]
    r = s.result()
    assert r.onset is None and r.clean is None and r.binding == "compute"


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"by": "tokens"}, "search by one of"),
        ({"by": "rate", "target": 1.5}, "attainment target"),
        ({"by": "concurrency", "start": 1.5}, "whole number"),
        ({"by": "rate", "start": 0}, "must be positive"),
        ({"by": "rate", "repeats": 5, "max_repeats": 2}, "repeats"),
    ],
)
def test_bad_plans_are_refused(kwargs: dict[str, object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        SearchPlan(**kwargs)  # type: ignore[arg-type]


def _doc(search: CapacitySearch) -> dict[str, object]:
    from kvwatch.loadgen.cmd_search import search_doc
    from kvwatch.loadgen.workload.spec import WorkloadSpec

    meta = [{"name": f"p{i}", **{k: getattr(p, k) for k in ("load", "requests", "attained",
            "preemptions", "duration_s")}} for i, p in enumerate(search.probes)]  # fmt: skip
    named = CapacitySearch(search.plan)
    for m, p in zip(meta, search.probes, strict=True):
        named.record(ProbeResult(p.load, p.requests, p.attained, p.preemptions, p.duration_s,
                                 str(m["name"])))  # fmt: skip
    return search_doc(named, {"tpot": 0.05}, "http://vllm", "m", WorkloadSpec(), meta, 0.0)


def search_fixture() -> dict[str, object]:
    """A search.json document of a search that found both limits (the fuzzers spoil it)."""
    return _doc(_drive(SearchPlan("concurrency", repeats=1, max_repeats=1), _kv_bound,
                       _preempts_from_4))  # fmt: skip


def test_the_console_says_what_was_found() -> None:
    from kvwatch.loadgen.results.search_file import render_search, search_from_doc

    s = _drive(SearchPlan("concurrency", repeats=1, max_repeats=1), _kv_bound, _preempts_from_4)
    text = render_search(search_from_doc(_doc(s)))
    assert "Highest load meeting the SLOs (tpot <= 50 ms) for 95% of requests: 5 in flight" in text
    assert "Next above it, 6 in flight: 50%" in text
    assert "KV onset: preemption starts at 4 in flight (1.20/s); none at 3." in text
    assert "The KV cache binds first" in text
    row = next(line for line in text.splitlines() if line.startswith("4 "))
    assert "KV onset" in row and "100%" in row


def test_the_capacity_page_marks_both_limits(tmp_path: Path) -> None:
    import json

    from kvwatch.loadgen.results.search_file import SEARCH_FILE
    from kvwatch.report.capacity_page import render_capacity

    s = _drive(SearchPlan("concurrency", repeats=1, max_repeats=1), _kv_bound, _preempts_from_4)
    (tmp_path / SEARCH_FILE).write_text(json.dumps(_doc(s)))
    page = render_capacity(tmp_path)
    assert page.count("<svg") == 2 and ">SLO limit</text>" in page and ">KV onset</text>" in page
    assert "Limit that binds first: <b>kv cache</b>" in page
    assert "is not in this directory" in page  # no probe directories in this synthetic one


@pytest.mark.parametrize(
    "broken",
    ["{", "[]", '{"kind": "capacity_search"}',
     '{"kind": "capacity_search", "result": {"by": "rate", "attainment_target": 0.9}}'],
)  # fmt: skip
def test_a_broken_search_file_is_a_clear_error(tmp_path: Path, broken: str) -> None:
    from kvwatch.common.cli_kit import CliError
    from kvwatch.loadgen.results.search_file import SEARCH_FILE
    from kvwatch.report.capacity_page import render_capacity

    (tmp_path / SEARCH_FILE).write_text(broken)
    with pytest.raises(CliError, match="not a readable capacity search"):
        render_capacity(tmp_path)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--slo", ""], 2, "--slo names no limit"),
        (["--slo", "ttft=fast"], 2, "use METRIC=VALUE"),
        (["--slo", "ttft=1s", "--attainment", "2"], 2, "--attainment: must be a share above 0"),
        (["--slo", "ttft=1s", "--start", "0.5"], 2, "whole number"),
        (["--slo", "ttft=1s", "--probe-requests", "0"], 2, "--probe-requests: must be a whole"),
        (["--slo", "ttft=1s", "--url", "http://127.0.0.1:9"], 3, "cannot reach"),
    ],
)
def test_refusals_are_one_line(args: list[str], code: int, says: str) -> None:
    """The last line says why (argparse's usage may come above it), never a traceback."""
    from tests.cli_fuzzing import check, run_cli

    o = run_cli(["loadgen", "search", "--url", "http://127.0.0.1:9", *args])
    check(o)
    assert o.code == code and says in o.stderr.splitlines()[-1], o.stderr


def test_a_probe_is_one_stage_sized_for_its_load() -> None:
    from kvwatch.loadgen.cmd_search import probe_stage
    from kvwatch.loadgen.workload.arrivals import Concurrency, Poisson

    c = probe_stage("concurrency", 8, "p", None, None)
    assert c.pattern == Concurrency(8) and c.count == 32 and c.duration_s is None
    assert probe_stage("concurrency", 2, "p", None, None).count == 16  # at least 16
    r = probe_stage("rate", 2.5, "p", None, None)
    assert r.pattern == Poisson(2.5) and r.duration_s == 30.0 and r.count is None
    assert probe_stage("rate", 2.5, "p", 100, None).count == 100


def _measured(timeline: list[dict[str, float]], preemptions: float = 0.0) -> object:
    from kvwatch.loadgen.measure import Measured

    cache = {"num_blocks": 40, "block_size": 32}
    before = {"preemptions_total": 0.0, "cache": cache}
    after = {"preemptions_total": preemptions, "cache": cache}
    records = [{"prompt_tokens": 480}] * 3
    return Measured(0.0, records, [], timeline, before, after)  # type: ignore[arg-type]


def test_the_cache_ran_out_by_preempting_or_by_queueing_for_room() -> None:
    from kvwatch.loadgen.cmd_search import kv_ran_out

    room = [{"t": 0.0, "kv_usage": 0.5, "waiting": 1.0}]  # 640 tokens free: a prompt fits
    full = [{"t": 0.0, "kv_usage": 0.7, "waiting": 1.0}]  # 384 free: a 480-token prompt waits
    assert kv_ran_out(_measured(room)) is False  # type: ignore[arg-type]
    assert kv_ran_out(_measured(full)) is True  # type: ignore[arg-type]
    assert kv_ran_out(_measured(room, preemptions=2)) is True  # type: ignore[arg-type]
    assert kv_ran_out(_measured([])) is None  # type: ignore[arg-type]


def test_queueing_for_room_alone_makes_the_cache_bind() -> None:
    s = CapacitySearch(SearchPlan("concurrency", repeats=1, max_repeats=1))
    s.record(ProbeResult(2, 20, 20, 0.0, 10.0, "a", kv_ran_out=False))
    s.record(ProbeResult(3, 20, 12, 0.0, 10.0, "b", kv_ran_out=True))
    r = s.result()
    assert r.onset is None and r.ran_out is not None and r.ran_out.load == 3
    assert r.binding == "kv cache"
