"""What one scrape's HTTP request costs the sidecar's httpx client, with and without ``sniffio`` importable.

Run: ``.venv/bin/python -m bench.scrape_client`` (``--rounds N --requests M``). A local aiohttp server answers
a page the size of a light scrape (0.9 KB); the client is the scraper's (``httpx.AsyncClient``, one kept
connection). httpcore 1.0 imports ``sniffio`` four times a request to tell asyncio from trio; when it is not
installed each import fails and searches the path again. The two cases alternate in rounds, each in a fresh
process (``sniffio`` hidden from the second by a finder that refuses it), so machine noise hits both alike;
the table shows process CPU per request (client and server together) and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

PAGE = b"x" * 900


async def _cpu_per_request(requests: int) -> float:
    import httpx  # noqa: PLC0415 - imported after the finder, in the measuring process
    from aiohttp import web  # noqa: PLC0415

    async def page(_: web.Request) -> web.Response:
        return web.Response(body=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with httpx.AsyncClient() as client:
            await client.get(f"http://127.0.0.1:{port}/metrics")
            started = time.process_time()
            for _ in range(requests):
                await client.get(f"http://127.0.0.1:{port}/metrics")
            return (time.process_time() - started) / requests
    finally:
        await runner.cleanup()


class _NoSniffio:
    """A finder that makes ``import sniffio`` fail as on a machine without it: after searching the whole path."""

    @staticmethod
    def find_spec(name: str, *_: object) -> None:
        if name == "sniffio":
            for finder in sys.meta_path[1:]:  # every finder asked, as for a module that is not there
                finder.find_spec("sniffio_is_not_installed", None, None)
            raise ModuleNotFoundError("No module named 'sniffio'")


def _child(hide: bool, requests: int) -> None:
    if hide:
        sys.meta_path.insert(0, _NoSniffio())  # type: ignore[arg-type]
    print(asyncio.run(_cpu_per_request(requests)))


def main() -> None:
    """Alternate both cases and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--child", choices=["with", "without"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child == "without", args.requests)
        return
    try:
        import sniffio  # noqa: F401, PLC0415
    except ImportError:
        sys.exit("sniffio is not installed here: `make setup` installs it (a runtime dependency)")
    seconds: dict[str, list[float]] = {"with": [], "without": []}
    for index in range(args.rounds):
        for case in ("with", "without") if index % 2 == 0 else ("without", "with"):
            command = [
                sys.executable,
                "-m",
                "bench.scrape_client",
                "--child",
                case,
                "--requests",
                str(args.requests),
            ]
            seconds[case].append(
                float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
            )
    with_it, without = statistics.median(seconds["with"]), statistics.median(seconds["without"])
    print(f"CPU per scrape request, median of {args.rounds} rounds of {args.requests} (client and server):")
    print(
        f"  sniffio importable   {with_it * 1e3:.3f} ms  rounds {[round(s * 1e3, 3) for s in seconds['with']]}"
    )
    print(
        f"  sniffio missing      {without * 1e3:.3f} ms  rounds {[round(s * 1e3, 3) for s in seconds['without']]}"
    )
    print(f"  ratio                {without / with_it:.2f}x")


if __name__ == "__main__":
    main()
