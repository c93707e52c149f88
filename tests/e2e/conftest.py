"""A real vLLM server (CPU build, tiny generated model) for the e2e tests; one per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.vllm import VllmServer, make_tiny_model, vllm_python


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    """vLLM's python (installed by scripts/install-vllm when missing)."""
    try:
        return vllm_python()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_model(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2-architecture model, generated for this session."""
    return make_tiny_model(vllm_env, tmp_path_factory.mktemp("model") / "tiny-model")


@pytest.fixture(scope="session")
def vllm_server(
    vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """vLLM with a 2,048-token pool (16 blocks of 128), max_model_len 1024, 4 sequences at most."""
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm.log")


def serve(
    python: Path,
    model: Path,
    tmp_path_factory: pytest.TempPathFactory,
    log: str,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[VllmServer]:
    """A started vLLM server (the fixtures' shape, more ``vllm serve`` flags), stopped when the generator closes."""
    server = VllmServer(
        python, model, log_path=tmp_path_factory.mktemp("logs") / log, extra_args=extra_args, env=env or {}
    )
    server.start()
    yield server
    server.stop()
