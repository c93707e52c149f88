"""The admission suite's traffic shapes and how one round of a shape is drawn. Pure.

Shapes (``/v1/completions``, temperature 0, ``ignore_eos`` unless said):

- ``long-prompt``: 8 long (600-token prompt, 400 out) + 24 short (24 in, 16 out) over 2 s, shuffled.
- ``mid-size``: 16 mid (300-450 in, 300 out) + 16 short over 2 s; every prompt below the 512-token long line.
- ``generous-max-tokens``: 40 (80-120 in, max_tokens 900, temperature 1, a seed each, 8 stop token ids so
  random weights stop early: median ~40-60 tokens), half of them streamed (SSE read to ``[DONE]``).
- ``shared-prefix``: 24 requests sharing one 512-token prefix (fresh per run) + 40-80 own tokens, 100 out.
- ``sustained-overload``: open-loop Poisson at 40 req/s (``--overload-rate``) for ``--overload-seconds`` (75% short, 25% 300+200),
  120 s client timeout; a 429/503 with Retry-After is retried once after exactly that wait. On 2 cores vLLM
  served ~10-12 req/s of this mix on 2026-12-03 and kept up with 20 on 2026-12-05 (a fresh-clone CI run: no
  preemption, short p95 0.04 s), so the default is 40 (31-49 preemptions a minute straight that day).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

STOP_IDS = (11, 77, 131, 199, 263, 317, 401, 463)


@dataclass(frozen=True)
class Kind:
    """One kind of request in a shape (``count`` is a weight in an open-loop shape)."""

    name: str  # "short" / "long" / ...: what Shape.short_kind and long_kind name
    count: int  # requests of this kind in a burst; the mix's weight in an open-loop shape
    prompt: tuple[int, int]  # prompt tokens, uniform in [low, high]
    max_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0  # > 0: each request also carries a "seed"
    stream_share: float = 0.0  # every round(1 / share)-th request of the kind streams
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Shape:
    """A traffic shape: a burst spread over ``spread_seconds``, or open-loop Poisson when ``seconds`` > 0."""

    name: str
    kinds: tuple[Kind, ...]
    spread_seconds: float = 2.0  # a burst's arrivals, uniform over this many seconds
    shared_prefix: int = 0  # tokens every request of a run starts with (fresh per run)
    short_kind: str | None = "short"  # whose p95 is "short p95" (None: all requests)
    long_kind: str | None = "long"  # whose p50 is "long/mid p50" (None: all requests)
    seconds: float = 0.0  # > 0: open-loop Poisson arrivals for this long, at ``rate`` per second
    rate: float = 0.0
    retry_once: bool = False  # a 429/503 with Retry-After: wait exactly that, retry once
    request_timeout: float = 180.0  # per attempt, client side


SHORT = Kind("short", 24, (24, 24), 16)
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("long-prompt", (Kind("long", 8, (600, 600), 400), SHORT)),
    Shape("mid-size", (Kind("mid", 16, (300, 450), 300), dataclasses.replace(SHORT, count=16)), long_kind="mid"),
    Shape("generous-max-tokens", (Kind("gen", 40, (80, 120), 900, False, 1.0, 0.5, STOP_IDS),),
          short_kind=None, long_kind="gen"),
    Shape("shared-prefix", (Kind("shared", 24, (40, 80), 100),), shared_prefix=512, short_kind=None,
          long_kind="shared"),
    Shape("sustained-overload", (dataclasses.replace(SHORT, count=3), Kind("mid", 1, (300, 300), 200)),
          long_kind="mid", seconds=60.0, rate=40.0, retry_once=True, request_timeout=120.0),
)}  # fmt: skip


@dataclass(frozen=True)
class Planned:
    """One client of a run: when it sends and what (its tokens are drawn per run)."""

    kind: Kind
    at: float
    prompt_len: int
    stream: bool
    seed: int


def plan(shape: Shape, seed: str) -> list[Planned]:
    """The kinds, sizes and arrival times of one round (the same for both targets)."""
    rng = random.Random(seed)
    if shape.seconds > 0:
        kinds, at, starts = [], rng.expovariate(shape.rate), []
        while at < shape.seconds:
            kinds.append(rng.choices(shape.kinds, weights=[k.count for k in shape.kinds])[0])
            starts.append(at)
            at += rng.expovariate(shape.rate)
    else:
        kinds = [k for k in shape.kinds for _ in range(k.count)]
        rng.shuffle(kinds)
        starts = sorted(rng.uniform(0, shape.spread_seconds) for _ in kinds)
    streamed: dict[str, int] = {}
    out = []
    for i, (kind, start) in enumerate(zip(kinds, starts, strict=True)):
        streamed[kind.name] = streamed.get(kind.name, 0) + 1
        stream = kind.stream_share > 0 and streamed[kind.name] % round(1 / kind.stream_share) == 0
        out.append(Planned(kind, start, rng.randint(*kind.prompt), stream, i))
    return out
