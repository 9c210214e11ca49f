"""Generation speed: ``model.generate`` with its KV cache against a full forward pass per
token (one compiled program over a fixed window) and against transformers' ``generate``
(torch eager, its own cache) on the same random weights (float32: near-tied logits may
pick different tokens after a while; tests/unit/test_generate.py compares in float64).

    python benchmarks/generate.py                       # a 4-layer Llama, 64 new tokens
    python benchmarks/generate.py --layers 2 --new 16   # smaller

Greedy decoding of one prompt (batch 1); the first call of each Tessera path compiles
(reported apart), the table's rates are warm calls (median of ``--repeat``). Kernels are
``TESSERA_KERNELS``' (the reference executor unless set: Triton's CPU interpreter is far
slower than torch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import tessera as ts
from tessera import models


def config(layers: int, hidden: int) -> dict:
    return {
        "model_type": "llama", "vocab_size": 256, "hidden_size": hidden,
        "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 1024,
    }  # fmt: skip


def recompute(model: models.CausalLM, params: dict, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy tokens by a full forward pass of a fixed window per token."""
    window = prompt.shape[1] + new
    logits = ts.jit(model.logits)
    ids = prompt[0].tolist()
    for _ in range(new):
        tokens = torch.zeros((1, window), dtype=torch.int64)
        tokens[0, : len(ids)] = torch.tensor(ids)
        ids.append(int(torch.as_tensor(logits(params, tokens))[0, len(ids) - 1].argmax()))
    return torch.tensor([ids])


def timed(fn, repeat: int) -> tuple[float, list[float], torch.Tensor]:
    """The first call's seconds, the following calls' seconds, the last tokens."""
    start = time.perf_counter()
    tokens = fn()
    first = time.perf_counter() - start
    warm = []
    for _ in range(repeat):
        start = time.perf_counter()
        tokens = fn()
        warm.append(time.perf_counter() - start)
    return first, warm, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1,
        help="torch threads (1: small ops on a shared CPU are slowed badly by more)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TESSERA_KERNELS", "reference")
    torch.manual_seed(0)
    model = models.from_config(config(args.layers, args.hidden))
    params = {n: 0.05 * torch.randn(s) for n, s in model.param_shapes().items()}
    prompt = torch.randint(0, 256, (1, args.prompt))

    rows = []
    first, warm, cached = timed(
        lambda: model.generate(params, prompt, args.new, temperature=0).tokens, args.repeat
    )
    rows.append(("tessera generate (KV cache)", first, warm))
    first, warm, full = timed(lambda: recompute(model, params, prompt, args.new), args.repeat)
    rows.append(("tessera, full forward per token", first, warm))
    reference = None
    try:
        import transformers

        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config(args.layers, args.hidden)))
        hf.load_state_dict({n: p.clone() for n, p in params.items()}, strict=False)
        hf.eval()
        with torch.no_grad():
            first, warm, reference = timed(
                lambda: hf.generate(
                    prompt, max_new_tokens=args.new, do_sample=False, min_new_tokens=args.new,
                    pad_token_id=0, eos_token_id=None,
                ),
                args.repeat,
            )
        rows.append(("transformers generate (eager, cache)", first, warm))
    except ImportError:
        pass
    agree = f"the two Tessera paths give the same tokens: {torch.equal(cached, full)}"
    if reference is not None:  # float32 logits of random weights have near-ties
        new_tokens = (cached[0, args.prompt :] == reference[0, args.prompt :]).tolist()
        leading = new_tokens.index(False) if False in new_tokens else len(new_tokens)
        agree += f"; transformers agrees on the first {leading} of {args.new} new tokens"
    print(
        f"Greedy generation, Llama {args.layers} layers x {args.hidden} (GQA 8/4 heads), "
        f"prompt {args.prompt}, {args.new} new tokens, kernels {os.environ['TESSERA_KERNELS']}, "
        f"torch threads {torch.get_num_threads()}, float32; {agree}\n"
    )
    print("| path | first call s | warm s (median) | new tokens/s (warm) |")
    print("|---|---:|---:|---:|")
    for name, first, warm in rows:
        median = statistics.median(warm)
        print(f"| {name} | {first:.2f} | {median:.2f} | {args.new / median:.1f} |")


if __name__ == "__main__":
    main()
