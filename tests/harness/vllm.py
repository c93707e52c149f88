"""The real-engine harness: vLLM's CPU build, a tiny generated model, a server started and stopped by pid.

Used by the e2e tests, ``make demo`` and the benchmarks (``bench/spike.py``, ``bench/admission_suite.py``). ``scripts/install-vllm`` installs vLLM
into its own environment outside the checkout (reused when present); ``scripts/make_tiny_model.py``
generates the model at run time (never committed). :class:`VllmServer` starts
``vllm.entrypoints.openai.api_server`` with a small KV pool (``--num-gpu-blocks-override``), waits for
``/health`` and stops it with SIGTERM to its own pid (never by name).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).parents[2]


def vllm_python() -> Path:
    """Install vLLM's CPU build if needed; the python of its environment."""
    result = subprocess.run([str(ROOT / "scripts/install-vllm")], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"installing vLLM failed: {result.stderr.strip()[-2000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def make_tiny_model(python: Path, out: Path, *, hybrid: bool = False, vl: bool = False) -> Path:
    """Generate the tiny model into ``out`` (reused when it is already there).

    ``hybrid``: a sliding-window layer too; ``vl``: a Qwen2-VL that takes images (served with
    :func:`vision_path` on its ``PYTHONPATH``).
    """
    if not (out / "model.safetensors").is_file():
        script = [str(python), str(ROOT / "scripts/make_tiny_model.py"), str(out)]
        script += ["--hybrid"] * hybrid + ["--vl"] * vl
        subprocess.run(script, check=True, capture_output=True)
    return out


def run_probe(python: Path, script: Path, *args: str, timeout: float = 900) -> str:
    """Run ``script`` with vLLM's ``python`` (a probe that loads vLLM in-process); its stdout, or fail."""
    result = subprocess.run(
        [str(python), str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def tagged_records(stdout: str, tag: str) -> list[dict[str, Any]]:
    """The JSON records a probe printed as ``TAG {json}`` lines (:func:`tests.e2e.inprocess.print_engines`)."""
    prefix = f"{tag} "
    return [json.loads(line.removeprefix(prefix)) for line in stdout.splitlines() if line.startswith(prefix)]


def probe_runs(python: Path, script: Path, tag: str, *args: str) -> dict[str, dict[str, Any]]:
    """Run a probe (:func:`run_probe`) and key its ``tag`` records by their ``run`` label."""
    return {record["run"]: record for record in tagged_records(run_probe(python, script, *args), tag)}


def made_and_measured(
    python: Path, script: Path, tag: str, tiny_model: Path, root: Path
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A probe's ``make`` into ``root`` (with the tiny model's tokenizer), then its ``measure`` records."""
    run_probe(python, script, "make", str(tiny_model), str(root))
    return root, probe_runs(python, script, tag, "measure", str(root))


def layer_index(name: str) -> int:
    """``model.layers.5.self_attn.attn`` -> 5."""
    return int(name.split("layers.")[1].split(".", maxsplit=1)[0])


def vision_path() -> Path:
    """Install torchvision beside vLLM's environment if needed (``scripts/install-vllm-vision``); its path."""
    result = subprocess.run(
        [str(ROOT / "scripts/install-vllm-vision")], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"installing torchvision failed: {result.stderr.strip()[-2000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


async def wait_http(url: str, within: float = 60.0) -> None:
    """Poll ``url`` until it answers 200."""
    import asyncio  # noqa: PLC0415 - only the async callers need it

    import aiohttp  # noqa: PLC0415

    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {within:g}s")


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmServer:
    """One vLLM server process on loopback."""

    python: Path
    model: Path
    port: int = field(default_factory=free_port)
    max_model_len: int = 1024
    max_num_seqs: int = 4
    gpu_blocks: int | None = 16
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()  # more ``vllm serve`` flags
    env: dict[str, str] = field(default_factory=dict)  # more environment (``PYTHONPATH`` for a vision model)
    process: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        args = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs), "--dtype", "bfloat16",
        ]  # fmt: skip
        if self.gpu_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.gpu_blocks)]
        return [*args, *self.extra_args]

    def start(self, timeout: float = 300.0) -> None:
        """Start and wait for ``/health``."""
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_SERVER_DEV_MODE": "1",  # serves POST /reset_prefix_cache: benchmark runs start from a cold cache
            **self.env,
        }
        self._log_file = open(self.log_path, "wb") if self.log_path else None  # noqa: SIM115 - closed by stop()
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.model,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with status {self.process.returncode} (log: {self.log_path})"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy within {timeout:.0f}s (log: {self.log_path})")

    def stop(self) -> None:
        """SIGTERM to the server's own pid (it stops its engine subprocesses), then wait."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
