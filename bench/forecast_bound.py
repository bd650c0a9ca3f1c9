"""How right can any exhaustion forecast be on the fixture's ramps? A bound, by simulation.

    PYTHONPATH=. .venv/bin/python bench/forecast_bound.py [--runs 200] [--draws 100] [--seed 1]

bench_forecast.py's ramp is deterministic (loadgen's `ramp` spaces sends by the rate's integral,
whatever the seed), yet its eleven recorded runs ran out anywhere between 31 and 51 s. What
differs between them is the server's speed: on the shared CPU machine a decode step took 10 to
17 ms, changing from one 5 s stretch to the next, and a request holds its blocks for 300 steps.

This simulates the fixture block by block with vLLM v1's rules (bench/fixture_sim.py): 39
usable blocks of 32 tokens (40 less vLLM's null block), 30 + 300 tokens a request, the recorded
ramp's send times (`Ramp.offsets`). The speed is the recordings': a run's
typical step time drawn from the recorded runs' (running requests / generation tokens per
second), and each 5 s span strays from it as a recorded span strayed from its run's.

Then it asks an oracle no sidecar can be: one that knows the ramp's rate, every running
request's length and the run's typical step time, but not how the next spans stray from it
(nor, with `--poisson`, when the next requests come). Its forecast is the
median of `--draws` simulated futures from that state. Its median relative error when the truth
was 30, 10 and 5 s away is about the least any forecast can be off here; a forecast from
`/metrics` knows less. Beside it, the sidecar's own forecast on the same simulated ramps, fed
what `/metrics` would have said at each 0.5 s scrape: how right it is on a fixture without the
real machine's stalls. The simulated exhaustion times are printed beside the recorded ones, as
a check on the calibration.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_forecast import OUT, _full_at, _load_run, sidecar  # noqa: E402
from fixture_sim import SCRAPE_S, SEGMENT_S, Engine, Speeds, run_until_out  # noqa: E402

from kvwatch.loadgen.workload.arrivals import Ramp  # noqa: E402
from kvwatch.sidecar.judge.timeline import Timeline  # noqa: E402
from kvwatch.sidecar.metrics.observe import CacheConfig, EngineObservation  # noqa: E402

HORIZONS = (30.0, 10.0, 5.0)
RAMP = Ramp(0.2, 3.0)
RAMP_S = 90.0
SENDS = list(RAMP.offsets(random.Random(0), RAMP_S))  # what loadgen's ramp sends, any seed


def future_sends(poisson: bool, after: float, rng: random.Random) -> list[float]:
    """The sends after `after`: the recorded ramp's, or with `poisson` a Poisson process of the
    same rate (by thinning), drawn afresh."""
    if not poisson:
        return [t for t in SENDS if t > after]
    top, out, t = RAMP.end, [], after
    while True:
        t += rng.expovariate(top)
        if t >= RAMP_S:
            return out
        if rng.random() * top <= RAMP.start + (RAMP.end - RAMP.start) * t / RAMP_S:
            out.append(t)


def recorded_speeds() -> Speeds:
    per_run, deviations = [], []
    for path in sorted(OUT.glob("run-*.jsonl")):
        spans = step_times(path)
        if spans:
            typical = statistics.fmean(spans)
            per_run.append(typical)
            deviations += [s / typical - 1.0 for s in spans]
    return Speeds(per_run, deviations)


def step_times(path: Path) -> list[float]:
    """Seconds per decode step in each 5 s span of a recorded ramp, before the cache ran out
    (running requests / generation tokens per second, spans with two or more running)."""
    run = _load_run(path)
    full_at = _full_at(run) or math.inf
    span = int(SEGMENT_S / SCRAPE_S)
    out = []
    for i in range(0, len(run) - span, span):
        (t0, a), (t1, b) = run[i], run[i + span]
        if t1 > full_at:
            break
        running = statistics.fmean(o.running or 0.0 for _, o in run[i : i + span + 1])
        gen = ((b.generation_tokens_total or 0) - (a.generation_tokens_total or 0)) / (t1 - t0)
        if running >= 2 and gen > 0:
            out.append(running / gen)
    return out


def observed(e: Engine) -> EngineObservation:
    """What vLLM's /metrics would say of this state (the lines the forecasts read)."""
    sh = e.shape
    return EngineObservation(
        kv_usage=sum(map(sh.blocks_for, e.running)) / sh.blocks,
        running=float(len(e.running)),
        waiting=float(e.waiting),
        prompt_tokens_total=float(e.admitted * sh.prompt),
        generation_tokens_total=float(e.generated),
        preemptions_total=0.0,
        cache=CacheConfig(block_size=sh.block_tokens, num_blocks=sh.blocks + 1),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=200, help="simulated ramps (default 200)")
    ap.add_argument("--draws", type=int, default=100, help="futures per forecast (default 100)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--poisson", action="store_true",
        help="Poisson arrivals at the ramp's rate instead of loadgen's evenly spaced sends",
    )  # fmt: skip
    ns = ap.parse_args()
    rng = random.Random(ns.seed)
    speeds = recorded_speeds()
    kind = "poisson" if ns.poisson else "run"
    recorded = [x for x in (_full_at(_load_run(p)) for p in OUT.glob(f"{kind}-*.jsonl")) if x]
    typical = ", ".join(f"{s * 1e3:.1f}" for s in sorted(speeds.per_run))
    spread = statistics.pstdev(speeds.deviations)
    print(f"step time by run, recorded: {typical} ms; a 5 s span strays {spread:.0%} (sd)")
    errors: dict[str, dict[float, list[float]]] = {"oracle": {}, "sidecar": {}}
    for by in errors.values():
        by.update({h: [] for h in HORIZONS})
    outs = []
    for _ in range(ns.runs):
        snaps: list[Engine] = []
        start = Engine(
            sends=future_sends(ns.poisson, 0.0, rng), typical_step_s=speeds.draw_run(rng)
        )
        out = run_until_out(start, rng, speeds, lambda t, e, into=snaps: into.append(e.copy(t)))
        outs.append(out)
        timeline, said = Timeline(), {}
        for s in snaps:  # the sidecar's forecast at every scrape, from what /metrics would say
            timeline.add(s.t, observed(s))
            said[s.t] = sidecar(timeline, s.t)
        for h in HORIZONS:
            near = [s for s in snaps if abs(out - s.t - h) <= SCRAPE_S / 2]
            if not near:
                continue
            s, left = near[0], out - near[0].t
            futures = []
            for _ in range(ns.draws):
                future = s.copy()  # the same state; its sends to come drawn again
                future.sends = future_sends(ns.poisson, s.t, rng)
                futures.append(run_until_out(future, rng, speeds) - s.t)
            errors["oracle"][h].append(abs(statistics.median(futures) - left) / left)
            got = said[s.t]
            errors["sidecar"][h].append(1.0 if got is None else abs(got - left) / left)
    q = statistics.quantiles(outs, n=10)
    print(f"ran out, simulated ({ns.runs} ramps): median {statistics.median(outs):.1f} s, "
          f"10-90% {q[0]:.1f}-{q[-1]:.1f} s")  # fmt: skip
    lo, mid, hi = min(recorded), statistics.median(recorded), max(recorded)
    print(f"ran out, recorded ({len(recorded)} {kind}-N ramps): median {mid:.1f} s, "
          f"{lo:.1f}-{hi:.1f} s")  # fmt: skip
    print("median relative error (no forecast counts as 100%):")
    print("| forecast | " + " | ".join(f"{h:g} s out" for h in HORIZONS) + " |")
    print("|---|" + "---|" * len(HORIZONS))
    for name, label in (
        ("oracle", "the oracle (knows the ramp, every request's length, the run's speed)"),
        ("sidecar", "the sidecar's band, on the simulated /metrics"),
    ):
        cells = [f"{statistics.median(v):.0%} (n={len(v)})" for v in errors[name].values()]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
