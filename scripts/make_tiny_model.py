"""Generate a tiny real-architecture model (Qwen2, random weights) with a real BPE tokenizer.

Run with the vLLM environment's python (it has torch, transformers and tokenizers):
``$(scripts/install-vllm) scripts/make_tiny_model.py OUT_DIR``. Nothing is downloaded; the directory is
about 0.7 MB and is never committed. Shape: 2 layers, hidden 128, 2 attention heads, 1 KV head,
head_dim 64 (the CPU attention kernels need 64), intermediate 256, vocab 512, bf16: 512 bytes of KV
per token (2 x 1 x 64 x 2 bytes x 2 layers).

``--hybrid`` makes the same shape a Llama whose second layer attends to a 128-token sliding window
(``layer_types``, as Gemma and gpt-oss configs spell it): vLLM gives it two KV cache groups. Qwen2 is not
used for it because vLLM's Qwen2 refuses per-layer windows.

``--vl`` makes a Qwen2-VL (``Qwen2VLForConditionalGeneration``, about 2 MB) whose text part has the shape
above (rope ``mrope_section`` [8, 12, 12], which sums to head_dim / 2) and whose vision tower is one block of
width 128 (2 heads of 64, mlp_ratio 2), patch_size 14, temporal_patch_size 2, spatial_merge_size 2, merger
out 128.
The tokenizer adds ``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>`` and ``<|video_pad|>`` (ids 3-6,
also in config.json); the chat template renders an image part as
``<|vision_start|><|image_pad|><|vision_end|>``, which vLLM expands to one ``<|image_pad|>`` per merged
28x28 patch. ``preprocessor_config.json`` sets min_pixels 56*56 and max_pixels 112*112, so an image costs
4 to 16 placeholder tokens: 56x56 -> (56/14)^2/4 = 4, 112x112 -> 16, and a 224x224 one is shrunk to
112x112 -> 16; with the template's two marker tokens an image adds 6 to 18 to ``usage.prompt_tokens``.
Serving it needs torchvision, which vLLM's environment lacks on purpose (its wheel breaks imports there):
vLLM's qwen2_vl.py imports transformers' torchvision image processor module, and the processor needs
transformers' torchvision video processor. ``scripts/install-vllm-vision`` installs a copy beside that
environment and prints the directory to put on that server's ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

CORPUS = [
    "A GPU that holds a model's weights may still not hold four long requests at once.",
    "The key-value cache grows with every token of every sequence that is being generated.",
    "When the pool of cache blocks runs out, the scheduler queues new work or preempts a running sequence.",
    "Operators notice it from the outside: time to first token climbs and requests keep waiting.",
    "一张显存足够装下模型权重的显卡，未必能同时装下四路长上下文请求。",  # noqa: RUF001 (CJK on purpose)
    "键值缓存会随着每一条正在生成的序列、每一个新 token 不断增长。",
    "def plan(model, gpu, max_model_len, concurrency): return ledger",
    '{"model": "tiny", "prompt": "hello", "max_tokens": 16, "stream": true}',
    "0123456789 +-*/=()[]{}<>,.;:!?'\" \n\t",
]
# ChatML that also prints what a tool-calling template prints (tools, calls' arguments, names, call ids,
# reasoning), so the e2e tier checks the sidecar's rebuilt messages and tools against vLLM's rendering. A chat
# without those renders as plain ChatML. ``{{ '\n' }}`` after a tag: templates render with trim_blocks.
CHAT_TEMPLATE = (
    "{% if tools is not none %}<|im_start|>tools{{ '\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}"
    "{% if message.name is defined %} {{ message.name }}{% endif %}"
    "{% if message.tool_call_id is defined %} {{ message.tool_call_id }}{% endif %}{{ '\\n' }}"
    "{% if message.reasoning_content is defined and message.reasoning_content is not none %}"
    "<think>{{ message.reasoning_content }}</think>{% endif %}{{ message['content'] }}"
    "{% if message.tool_calls is defined %}{% for call in message.tool_calls %}"
    "<tool_call>{{ call.function.name }} {{ call.function.arguments | tojson }}</tool_call>"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
END = "<|endoftext|>"
VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Content is a string or a list of OpenAI-style parts (vLLM hands image_url parts over as {"type": "image"}).
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VL_MIN_PIXELS, VL_MAX_PIXELS = 56 * 56, 112 * 112


def save_vl(out: Path, shape: dict, tokenizer: Tokenizer) -> None:
    """Qwen2-VL weights, config and processor files (``--vl``); the tokenizer is already saved."""
    ids = {tok: tokenizer.token_to_id(tok) for tok in VL_TOKENS}
    text = dict(shape)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}
    vision = {
        "depth": 1,
        "embed_dim": 128,
        "num_heads": 2,
        "mlp_ratio": 2,
        "hidden_size": shape["hidden_size"],
        "patch_size": 14,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "min_pixels": VL_MIN_PIXELS,
        "max_pixels": VL_MAX_PIXELS,
        "size": {"shortest_edge": VL_MIN_PIXELS, "longest_edge": VL_MAX_PIXELS},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    processor = {"processor_class": "Qwen2VLProcessor"}
    (out / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def main() -> None:
    """Write the model named by the flags into the directory given as the first argument."""
    out = Path(sys.argv[1])
    vl = "--vl" in sys.argv[2:]
    if vl and "--hybrid" in sys.argv[2:]:
        sys.exit("--vl and --hybrid do not combine")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=[END, "<|im_start|>", "<|im_end|>"] + (VL_TOKENS if vl else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=END,
        pad_token=END,
        chat_template=VL_CHAT_TEMPLATE if vl else CHAT_TEMPLATE,
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
    if vl:
        save_vl(out, shape, tokenizer)
    elif "--hybrid" in sys.argv[2:]:
        hybrid = LlamaConfig(**shape, sliding_window=128, layer_types=["full_attention", "sliding_attention"])
        LlamaForCausalLM(hybrid).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
        model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    print(out)


if __name__ == "__main__":
    main()
