"""Run with vLLM's python: how much the profile's sampler pass holds with speculative decoding and without.

``make TOKENIZER_DIR OUT``: a random-weight two-layer Llama with a 65,536-token vocabulary (so that the
sampler's ``R x vocab`` tensors dwarf everything else). ``measure MODEL``: load it in vLLM in-process (CPU)
with 256 sequences, without speculative decoding and with n-gram drafting, and print as JSON, for each,
the peak resident memory of ``GPUModelRunner._dummy_sampler_run`` (the pass ``profile_run`` ends with) above
the memory before it, three times. The peak is read from ``VmHWM`` after resetting it (``clear_refs`` 5):
the CPU backend has no allocator statistics, and tensors this large are mapped and unmapped whole once
glibc's mmap threshold is fixed (``MALLOC_MMAP_THRESHOLD_``, which the probe sets by re-executing itself:
glibc's own threshold grows after large frees, and the heap then keeps freed tensors resident, which made
the peaks wander by a few ``R x vocab`` between runs). Used by ``test_rejection_profile.py``.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from inprocess import print_engines  # a sibling module: this script's folder is on sys.path

VOCAB, SEQUENCES = 65536, 256
MMAP_THRESHOLD = "131072"  # glibc's default, fixed: every tensor of the sampler is its own mapping


def make(tokenizer_dir: Path, out: Path) -> None:
    """The tiny Llama (see the module docstring)."""
    config = tf.LlamaConfig(
        hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, intermediate_size=256,
        vocab_size=VOCAB, max_position_embeddings=1024, num_hidden_layers=2, tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )  # fmt: skip
    tf.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def _status(field: str) -> int:
    with Path("/proc/self/status").open() as status:
        line = next(line for line in status if line.startswith(field))
    return int(line.split()[1]) * 1024


def _sampler_peaks(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    rows, hidden = runner.max_num_reqs, runner.model_config.get_hidden_size()
    peaks = []
    for _ in range(3):
        states = torch.zeros(rows, hidden, dtype=torch.bfloat16)
        gc.collect()
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
        output = runner._dummy_sampler_run(states)  # noqa: SLF001 - the pass profile_run runs
        peaks.append(_status("VmHWM") - before)
        del output
    return {"rows": rows, "vocab": runner.model_config.get_vocab_size(), "peaks": peaks}


def measure(model: str) -> None:
    """Print the sampler pass's peaks without speculative decoding and with n-gram drafting."""
    common = {"model": model, "max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": SEQUENCES}
    ngram = {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 3}
    print_engines(
        "SAMPLER", [("plain", common), ("ngram", common | {"speculative_config": ngram})], _sampler_peaks
    )


if __name__ == "__main__":
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:  # glibc reads it when the process starts
        fixed = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
        os.execve(sys.executable, [sys.executable, *sys.argv], fixed)  # noqa: S606 - the same probe, again
    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]), Path(args[1]))
    else:
        measure(args[0])
