"""How fast the default pack evaluates, against a straightforward pandas re-computation.

The engine updates every window incrementally (running sums, monotonic
deques), amortised O(1) per point. The obvious alternative — keep a
DataFrame per series and recompute the rolling statistics over the window
each time a batch of points arrives, as a notebook would — is measured in
the same run on the same points, so the ratio is what the design buys.
The engine must also keep up with ingestion: compare with bench/ingest.py.

    python bench/rules.py            # 1,000,000 points (engine), 100,000 (pandas)
    python bench/rules.py --quick
"""

from __future__ import annotations

import argparse
import math
import random
import time

from trainsentry.point import Point
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "step_time")


def synthetic(points: int, runs: int = 10) -> list[Point]:
    """Healthy-looking runs: a noisy decaying loss, a wandering grad norm, eval every 100."""
    rng = random.Random(0)
    steps = points // (runs * (len(TAGS) + 0.01))
    out: list[Point] = []
    for r in range(runs):
        run, t = f"exp/seed{r}", 1.7e9
        for step in range(int(steps)):
            t += 0.5 + 0.05 * rng.random()
            loss = 2.0 * math.exp(-step / 20000) + 0.1 * rng.random()
            values = (loss, 1.0 + 0.3 * rng.random(), 1e-3, 0.5 + 0.05 * rng.random())
            out.extend(Point(run, tag, step, t, v) for tag, v in zip(TAGS, values, strict=True))
            if step % 100 == 0:
                out.append(Point(run, "eval/loss", step, t, loss * 1.1))
    return out


def time_engine(points: list[Point]) -> float:
    engine = Engine(load_rules())
    start = time.perf_counter()
    for p in points:
        engine.feed(p)
    return time.perf_counter() - start


def time_pandas(points: list[Point], batch: int = 100) -> float:
    """Re-compute each series' windows over its last 2,000 points every `batch` arrivals."""
    import numpy as np
    import pandas as pd

    series: dict[tuple[str, str], list[float]] = {}
    pending = 0
    start = time.perf_counter()
    for p in points:
        series.setdefault((p.run, p.tag), []).append(p.value)
        pending += 1
        if pending < batch:
            continue
        pending = 0
        for values in series.values():
            s = pd.Series(values[-2000:])
            mean, std = s.rolling(100).mean(), s.rolling(100).std()
            spike = s > mean.shift(1) + 6 * std.shift(1)
            ewm = s.ewm(span=20).mean()
            rise = ewm > 3 * ewm.cummin()
            tail = s.tail(200)
            mad = (tail - tail.median()).abs().median()
            z = (s.iloc[-1] - tail.median()) / (1.4826 * mad + 1e-12)
            last30 = np.log(np.maximum(s.tail(30).to_numpy(), 1e-12))
            slope = np.polyfit(np.arange(len(last30)), last30, 1)[0] if len(last30) > 2 else 0
            _ = bool(spike.iloc[-1]), bool(rise.iloc[-1]), z > 20, slope, ~np.isfinite(s).all()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n_engine = 100_000 if args.quick else 1_000_000
    n_pandas = 20_000 if args.quick else 100_000
    points = synthetic(n_engine)
    rules = len(load_rules().rules)
    t_engine = time_engine(points)
    t_pandas = time_pandas(points[:n_pandas])
    rate_engine = len(points) / t_engine
    rate_pandas = n_pandas / t_pandas
    print(f"default pack: {rules} rules, {len(points):,} points in {t_engine:.2f} s")
    print(f"  trainsentry engine   {rate_engine:>12,.0f} points/s")
    print(f"  pandas re-compute    {rate_pandas:>12,.0f} points/s  (over {n_pandas:,} points)")
    print(f"  ratio                {rate_engine / rate_pandas:>12.1f}x")


if __name__ == "__main__":
    main()
