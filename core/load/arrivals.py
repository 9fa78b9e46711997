"""When each request of a rate level is sent: vLLM's `--request-rate` and `--burstiness`.

`vllm bench serve` draws the gap before each request from a gamma distribution
with shape `burstiness` and mean 1 / rate (shape 1.0 is a Poisson process;
below 1 the arrivals come in bursts, above 1 they are more even). An infinite
rate sends everything at once. `gamma_arrivals` returns the send times in
seconds from the level's start, seeded, so two runs (and two tools) can offer
the same load.
"""

from __future__ import annotations

import math

import numpy as np


def gamma_arrivals(rate: float, burstiness: float, count: int, seed: int = 0) -> tuple[float, ...]:
    """Send times (s from the start) of `count` requests at `rate` requests/s on average.

    The first request goes at 0. Raises ValueError for a rate or burstiness that is not positive.
    """
    if count < 1:
        raise ValueError("a level needs at least one request")
    if not rate > 0:
        raise ValueError(f"the request rate must be above 0 (got {rate})")
    if not burstiness > 0:
        raise ValueError(f"the burstiness must be above 0 (got {burstiness})")
    if math.isinf(rate):
        return (0.0,) * count
    generator = np.random.default_rng(seed)
    gaps = generator.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count - 1)
    return (0.0, *(float(t) for t in np.cumsum(gaps)))
