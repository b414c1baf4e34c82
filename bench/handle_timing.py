"""Handle timing: does a genuine handle of another principal take longer to refuse than a forged one?

Both must get the same answer (`unknown_handle`) and should cost the same work, or the time of
the refusal tells a caller "this server signed it". Two cases, measured interleaved (a fresh coin
decides the order of each pair), at three levels:

- `forged`: a well-formed handle for the caller's own principal, signed with a key the server does
  not have (what anyone can make);
- `other principal`: a handle the server really minted, for a job that exists, bound to another
  principal.

Levels: the codec alone (`HandleCodec.verify`), the tool `work_progress` through an in-process
`mcp.Client`, and the same tool over loopback Streamable HTTP (a `python -m bench.app` process).
For each: the medians, their difference (other - forged) and a two-sided Mann-Whitney U test
(normal approximation with tie correction). A printed figure, not a timed assertion.

    python bench/handle_timing.py                  # 2000 samples per case and level (about 30 s)
    python bench/handle_timing.py --samples 1500 --no-http
    python bench/run.py --only handle_timing       # the same, as a section of the suite (not in --quick)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SIGNING_KEY, Options, Table, client, log, quiet_gc, served
from handles.results import text_of

SECTION = "handle_timing"
DEFAULT_SAMPLES = 2000
CALLER = "local:local"
"""The principal of every request of the bench server (no authentication)."""


# -- statistics ------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(U of `a`, z, two-sided p) of the Mann-Whitney U test, normal approximation with tie correction."""
    n1, n2 = len(a), len(b)
    pooled = sorted([(value, 0) for value in a] + [(value, 1) for value in b])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        size = j - i + 1
        ties += size**3 - size
        i = j + 1
    rank_sum_a = sum(rank for rank, (_, group) in zip(ranks, pooled, strict=True) if group == 0)
    u = rank_sum_a - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return u, 0.0, 1.0
    z = (u - n1 * n2 / 2) / math.sqrt(variance)
    return u, z, math.erfc(abs(z) / math.sqrt(2))


# -- the two cases -----------------------------------------------------------------------------


def make_cases(job_id: str, kind: str, expires_at: Any) -> dict[str, str]:
    """`forged` and `other principal` handles of the same length, for the same job."""
    from handles.handle import HandleCodec

    claims = {"job_id": job_id, "kind": kind, "expires_at": expires_at}
    forged = HandleCodec([secrets.token_urlsafe(48)]).mint(principal=CALLER, **claims)
    other = HandleCodec([SIGNING_KEY]).mint(principal="local:someone-else", **claims)
    assert len(forged) == len(other), (forged, other)
    return {"forged": forged, "other principal": other}


async def sample(
    cases: dict[str, str], call: Callable[[str], Awaitable[None]], samples: int, warmup: int
) -> dict[str, list[float]]:
    """`samples` timings (seconds) per case, the two cases interleaved in a random order per pair."""
    names = list(cases)
    for _ in range(warmup):
        for name in names:
            await call(cases[name])
    out: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for _ in range(samples):
        random.shuffle(names)
        for name in names:
            started = clock()
            await call(cases[name])
            out[name].append(clock() - started)
    return out


async def _refused(c: Any, handle: str) -> None:
    result = await c.call_tool("work_progress", {"handle": handle})
    text = text_of(result)
    if not result.is_error or "unknown_handle" not in text:
        raise RuntimeError(f"expected unknown_handle, got {text!r}")


async def _job(c: Any) -> tuple[str, Any]:
    """A stored job of the bench server (a long one, never awaited) and its expiry."""
    from handles.handle import HandleCodec

    started = await c.call_tool("work_start", {"seconds": 3600})
    claims = HandleCodec([SIGNING_KEY]).inspect(started.structured_content["handle"])
    assert claims is not None
    return claims.job_id, claims.expires_at


async def measure(
    samples: int, warmup: int, work_dir: Path, *, http: bool = True
) -> dict[str, dict[str, list[float]]]:
    from bench.app import build_server, create_jobs
    from handles import HandlesConfig
    from handles.handle import HandleCodec
    from handles.store import utc_now

    results: dict[str, dict[str, list[float]]] = {}
    codec = HandleCodec([SIGNING_KEY])
    cases = make_cases(secrets.token_urlsafe(18), "work", utc_now() + timedelta(hours=1))

    async def verify(handle: str) -> None:
        if codec.verify(handle, principal=CALLER) is not None:
            raise RuntimeError("a refused handle was accepted")

    log(f"handle_timing: codec, {samples} samples per case")
    quiet_gc()
    results["codec (HandleCodec.verify)"] = await sample(cases, verify, samples, warmup)

    data_dir = Path(tempfile.mkdtemp(prefix="handle-timing-", dir=work_dir))
    jobs = create_jobs(HandlesConfig(data_dir=data_dir / "inprocess", secret_keys=(SIGNING_KEY,)))
    async with jobs.running(), client(build_server(jobs), tasks=False) as c:
        job_id, expires_at = await _job(c)
        cases = make_cases(job_id, "work", expires_at)
        log(f"handle_timing: in-process tool, {samples} samples per case")
        quiet_gc()
        results["work_progress, in-process"] = await sample(cases, lambda h: _refused(c, h), samples, warmup)
    if http:
        async with served("http", data_dir / "http", tasks=False) as c:
            job_id, expires_at = await _job(c)
            cases = make_cases(job_id, "work", expires_at)
            log(f"handle_timing: loopback HTTP tool, {samples} samples per case")
            quiet_gc()
            results["work_progress, loopback HTTP"] = await sample(
                cases, lambda h: _refused(c, h), samples, warmup
            )
    return results


def table(results: dict[str, dict[str, list[float]]], command: str) -> Table:
    out = Table(
        section=SECTION,
        title="Refusing a forged handle vs another principal's genuine handle",
        columns=[
            "level",
            "n per case",
            "forged p50 µs",
            "other p50 µs",
            "difference µs",
            "Mann-Whitney U",
            "p",
        ],
        command=command,
    )
    for level, samples in results.items():
        forged, other = samples["forged"], samples["other principal"]
        u, _z, p = mann_whitney_u(other, forged)
        diff = (median(other) - median(forged)) * 1e6
        out.rows.append(
            [
                level,
                len(forged),
                f"{median(forged) * 1e6:.1f}",
                f"{median(other) * 1e6:.1f}",
                f"{diff:+.1f}",
                f"{u:.0f}",
                f"{p:.3g}",
            ]
        )
        out.data[level] = {"forged_p50_us": median(forged) * 1e6, "other_p50_us": median(other) * 1e6, "p": p}
    out.notes += [
        "Interleaved samples: each pair of calls runs in a random order, so drift and noise hit both cases alike.",
        "difference = median(other principal) - median(forged); p: two-sided Mann-Whitney U (normal approximation, "
        "tie-corrected). A small p with a sizeable difference means the refusal time tells the two apart.",
        "Both cases get the same answer (`unknown_handle`); the bench checks it on every call.",
    ]
    return out


async def run(options: Options) -> list[Table]:
    samples = options.n(DEFAULT_SAMPLES, 1500)
    results = await measure(samples, 100, options.work_dir)
    return [table(results, options.section_command(SECTION))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/handle_timing.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help="samples per case and level (>= 1500)"
    )
    parser.add_argument("--no-http", action="store_true", help="skip the loopback HTTP level")
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="handle-timing-") as work:
        results = asyncio.run(measure(max(args.samples, 1), 100, Path(work), http=not args.no_http))
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    print(table(results, ("python bench/handle_timing.py " + shown).strip()).markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
