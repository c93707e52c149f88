"""Generate a tiny real-architecture model (Qwen2, random weights) with a real BPE tokenizer.

Run with the vLLM environment's python (it has torch, transformers and tokenizers):
``$(scripts/install-vllm) scripts/make_tiny_model.py OUT_DIR``. Nothing is downloaded; the directory is
about 0.7 MB and is never committed. Shape: 2 layers, hidden 128, 2 attention heads, 1 KV head,
head_dim 64 (the CPU attention kernels need 64), intermediate 256, vocab 512, bf16: 512 bytes of KV
per token (2 x 1 x 64 x 2 bytes x 2 layers).

``--hybrid`` makes the same shape a Llama whose second layer attends to a 128-token sliding window
(``layer_types``, as Gemma and gpt-oss configs spell it): vLLM gives it two KV cache groups. Qwen2 is not
used for it because vLLM's Qwen2 refuses per-layer windows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CORPUS = [
    "A GPU that holds a model's weights may still not hold four long requests at once.",
    "The key-value cache grows with every token of every sequence that is being generated.",
    "When the pool of cache blocks runs out, the scheduler queues new work or preempts a running sequence.",
    "Operators notice it from the outside: time to first token climbs and requests keep waiting.",
    "一张显存足够装下模型权重的显卡，未必能同时装下四路长上下文请求。",
    "键值缓存会随着每一条正在生成的序列、每一个新 token 不断增长。",
    "def plan(model, gpu, max_model_len, concurrency): return ledger",
    '{"model": "tiny", "prompt": "hello", "max_tokens": 16, "stream": true}',
    "0123456789 +-*/=()[]{}<>,.;:!?'\" \n\t",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE
    )
    fast.save_pretrained(out)
    shape = {
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    if "--hybrid" in sys.argv[2:]:
        hybrid = LlamaConfig(**shape, sliding_window=128, layer_types=["full_attention", "sliding_attention"])
        LlamaForCausalLM(hybrid).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    else:
        Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    print(out)


if __name__ == "__main__":
    main()
