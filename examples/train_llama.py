"""Train a small Llama on real text (Shakespeare, bytes or BPE tokens) with Tessera.

    python examples/train_llama.py                                 # data/shakespeare.txt, bytes
    python examples/train_llama.py --data FILE --tokenizer bpe --vocab 512
    python examples/train_llama.py --steps 300 --eval-every 50 --log run.jsonl --plot curve.png
    python examples/train_llama.py --steps 20 --save ckpt && python examples/train_llama.py --steps 40 --resume ckpt
    python examples/train_llama.py --steps 300 --save ckpt --checkpoint-every 50 --log-every 10
                                                                   # run again: resumes from ckpt
    python examples/train_llama.py --pp 2 --microbatches 4        # two pipeline stages
    tessera run -n 2 examples/train_llama.py --dp 2               # one process per rank (rank 0 reports)
    python examples/train_llama.py --dp 2 --tp 2 --zero 1 --precision bf16 --clip 1.0 \
        --lr-schedule warmup_cosine --warmup 10 --accumulate 2

The text is tokenized once (UTF-8 bytes, vocabulary 256, or with ``--tokenizer bpe`` a
byte-level BPE of ``--vocab`` tokens trained on the file with Hugging Face
``tokenizers``, kept as JSON) and its token stream written to a ``.npy`` file in
``--cache`` (default: Tessera's cache directory), memory-mapped from then on
(:mod:`tessera.data`). The stream is cut into windows of ``--seq + 1`` tokens; the last
``--held-out`` fraction is the validation split; training windows are drawn in an order
shuffled per epoch from ``--seed``. The model is :class:`tessera.models.Llama` (RMSNorm,
rotary embeddings, grouped-query attention, SwiGLU) with Hugging Face parameter names,
trained by one ``graph.training_step`` (AdamW) on a ``pp x dp x tp`` mesh with the
options the examples share (``_training_options.py``). Every ``--eval-every`` steps the
mean loss over ``--eval-batches`` held-out batches is measured; ``--log`` writes one JSON
object per step, ``--log-every`` prints a loss line every N steps, ``--plot`` the loss
curves. ``--save DIR`` checkpoints the training state with the loader's position into
``DIR/step_<k>`` at the end and every ``--checkpoint-every`` steps (the newest
``--keep-last`` kept); a run whose ``DIR`` holds a complete checkpoint resumes from it, as
``--resume DIR`` does, continuing the same stream. At the end
the model continues a prompt from the text (``--sample`` tokens, greedy or with
``--temperature``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import _training_options as training_options
import torch
from tqdm import tqdm

import tessera as ts
from tessera import data, dist, graph, models, optim, schedule
from tessera.cache_location import cache_directory
from tessera.training import CheckpointManager, checkpoint, checkpoint_policy
from tessera.training.preemption import Preemption

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "shakespeare.txt"
RANK0 = int(os.environ.get("RANK", "0")) == 0  # under `tessera run`, rank 0 reports


def say(*text: Any) -> None:
    if RANK0:
        print(*text, flush=True)


def make_model(args: argparse.Namespace, vocab: int) -> models.Llama:
    """A small Llama (grouped-query attention: ``--heads`` query heads, ``--kv-heads``)."""
    config = models.ModelConfig.from_dict({
        "model_type": "llama", "vocab_size": vocab, "hidden_size": args.dim,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "intermediate_size": args.ffn or 4 * args.dim,
        "rms_norm_eps": 1e-5, "max_position_embeddings": args.seq, "tie_word_embeddings": False,
    })  # fmt: skip
    model = models.from_config(config)
    assert isinstance(model, models.Llama)
    return model


def init_params(model: models.CausalLM, seed: int) -> dict[str, torch.Tensor]:
    """Norm weights 1, other weights normal with std 0.02 (output projections scaled by
    ``1 / sqrt(2 layers)``, as GPT-2 does)."""
    g = torch.Generator().manual_seed(seed)
    layers = model.config.num_hidden_layers
    params = {}
    for name, shape in model.param_shapes().items():
        if name.endswith("norm.weight"):
            params[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            params[name] = torch.zeros(shape)
        else:
            scale = (
                (2 * layers) ** -0.5
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else 1.0
            )
            params[name] = 0.02 * scale * torch.randn(shape, generator=g)
    return params


def make_step(mesh: dist.Mesh, model: models.CausalLM, args: argparse.Namespace) -> Any:
    @graph.training_step(
        optimizer=optim.AdamW(lr=training_options.learning_rate(args), weight_decay=args.weight_decay),
        mesh=mesh, param_shardings=model.param_shardings(mesh) if args.tp > 1 else None,
        **training_options.step_options(args),
    )  # fmt: skip
    def step(p, tokens, targets):
        loss = model.loss(p, tokens, targets)
        return graph.backward(loss), {"loss": loss}

    return step


def evaluate(loss: Any, params: Any, windows: data.Windows, batch: int, batches: int) -> float:
    """The mean loss over the first ``batches`` batches of ``windows`` (natural order)."""
    loader = data.Loader(windows, batch, shuffle=False)
    count = min(batches, max(1, len(windows) // batch))
    total = 0.0
    for _ in range(count):
        x, y = loader.next_batch()
        total += float(loss(params, torch.from_numpy(x), torch.from_numpy(y)))
    return total / count


def sample(
    model: models.CausalLM, params: Any, prompt: list[int], length: int,
    temperature: float = 0.0, seed: int = 0,
) -> tuple[list[int], float]:  # fmt: skip
    """``prompt`` followed by ``length`` tokens from ``model.generate`` (a KV cache, one
    compiled prefill and one decode program): greedy at temperature 0, else drawn with
    the key ``ts.random.key(seed)``; and the generation's tokens/s."""
    prompt_tensor = torch.tensor([prompt], dtype=torch.int64)
    out = model.generate(
        params, prompt_tensor, length, temperature=temperature, key=ts.random.key(seed)
    )
    return [int(t) for t in torch.as_tensor(out.tokens).reshape(-1)], out.tokens_per_second


def plot(records: list[dict[str, Any]], path: str, title: str) -> None:
    """Training loss per step and validation loss where measured, to the image ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1, label="train")
    val = [r for r in records if "val_loss" in r]
    if val:
        ax.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--data", default=str(DATA), help="a UTF-8 text file (default: data/shakespeare.txt)")
    add("--tokenizer", default="bytes", choices=("bytes", "bpe"))
    add("--vocab", type=int, default=512, help="BPE vocabulary size (with --tokenizer bpe)")
    add("--cache", default=None, help="where token streams and tokenizers are kept")
    add("--held-out", type=float, default=0.1, help="the fraction of the text held out")
    add("--seed", type=int, default=0, help="parameters and the shuffling of windows")
    add("--steps", type=int, default=300)
    add("--batch", type=int, default=8, help="sequences per step")
    add("--seq", type=int, default=64)
    add("--dim", type=int, default=128)
    add("--layers", type=int, default=4)
    add("--heads", type=int, default=4)
    add("--kv-heads", type=int, default=2)
    add("--ffn", type=int, default=None, help="MLP width (default 4 x --dim)")
    add("--lr", type=float, default=3e-3)
    add("--weight-decay", type=float, default=0.0)
    add("--dp", type=int, default=1)
    add("--tp", type=int, default=1)
    add("--eval-every", type=int, default=50, help="validation loss every N steps (0: never)")
    add("--eval-batches", type=int, default=4)
    add("--log", default=None, help="a JSONL file: one object per step")
    add("--plot", default=None, help="a PNG of the train and validation loss")
    add("--sample", type=int, default=200, help="tokens to generate after training")
    add("--prompt", default="ROMEO.\n", help="the prompt to continue")
    add("--temperature", type=float, default=0.0, help="0: greedy")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar")
    training_options.add_arguments(parser)
    training_options.add_checkpoint_arguments(parser, log_every=0)
    args = parser.parse_args(argv)
    training_options.check(args, parser.error)
    args.accumulate = args.accumulate or 1
    splits = args.dp * args.accumulate * (args.microbatches if args.pp > 1 else 1)
    if args.batch % splits:
        parser.error(
            f"--batch {args.batch} does not split over {splits} (dp x microbatches x accumulate)"
        )
    if args.dim % args.heads or args.heads % args.kv_heads:
        parser.error(
            f"--heads {args.heads} must divide --dim {args.dim}, --kv-heads must divide --heads"
        )
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Trains; returns the last step's record and the sample."""
    args = parse(argv)
    cache = Path(args.cache) if args.cache else cache_directory("data")
    if args.tokenizer == "bpe":
        tokenizer: data.Tokenizer = data.bpe_tokenizer(args.data, args.vocab, cache)
    else:
        tokenizer = data.ByteTokenizer()
    tokens = data.cached_tokens(args.data, tokenizer, cache)
    train, val = data.split(tokens, args.seq, args.held_out)
    loader = data.Loader(train, args.batch, seed=args.seed)

    model = make_model(args, tokenizer.vocab_size)
    params = init_params(model, args.seed)
    if args.pp > 1:
        mesh = dist.Mesh(axes=["pp", "dp", "tp"], shape=(args.pp, args.dp, args.tp))
        schedule.pipeline_microbatches(args.microbatches, kind=args.schedule, virtual=args.virtual)
    else:
        mesh = dist.Mesh(axes=["dp", "tp"], shape=(args.dp, args.tp))
    step = make_step(mesh, model, args)
    state = step.init(params)
    records: list[dict[str, Any]] = []
    manager = None
    if args.save:
        manager = CheckpointManager(
            args.save,
            every=args.checkpoint_every,
            keep_last=args.keep_last,
            async_save=args.async_save,
        )
    extra, resumed = None, ""
    if args.resume:
        source = checkpoint_policy.resolve(args.resume)
        step.restore(state, source)
        extra, resumed = checkpoint.read_extra(source), f"{args.resume} at step {state.step}"
    elif manager is not None:
        extra, resumed = manager.restore(step, state), f"step {state.step} ({args.save})"
    if extra is not None:
        if "data" in extra:  # the loader's position: the same stream continues
            loader.load_state_dict(extra["data"])
        if args.log and Path(args.log).exists():
            records = [json.loads(line) for line in Path(args.log).read_text().splitlines() if line]
            records = [r for r in records if r["step"] <= state.step]
        say(f"resumed from {resumed}, sample {loader.position}")
    # with --save, SIGTERM / SIGUSR1 save at the next step boundary and stop the run
    preemption = Preemption().install() if manager is not None else None
    try:
        return train_loop(
            args, model, step, state, loader, val, tokenizer, records, manager, preemption
        )
    finally:
        if preemption is not None:
            preemption.uninstall()


def train_loop(
    args: argparse.Namespace, model: models.CausalLM, step: Any, state: Any,
    loader: data.Loader, val: data.Windows, tokenizer: data.Tokenizer, records: list[dict[str, Any]],
    manager: CheckpointManager | None = None, preemption: Preemption | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Steps from ``state.step`` to ``--steps``, evaluating, logging, checkpointing (with
    the loader's position) and plotting."""
    loss_fn = ts.jit(model.loss)
    log = open(args.log, "w") if args.log and RANK0 else None  # noqa: SIM115 (closed below)
    if log:
        log.writelines(json.dumps(r) + "\n" for r in records)
    first = state.step
    bar = tqdm(
        total=args.steps,
        initial=first,
        disable=not (args.progress and RANK0),
        unit="step",
        file=sys.stderr,
    )
    record: dict[str, Any] = {}
    seen, elapsed = 0, 0.0
    for i in range(first, args.steps):
        x, y = loader.next_batch()
        start = time.perf_counter()
        loss = float(step(state, torch.from_numpy(x), torch.from_numpy(y))["loss"])
        took = time.perf_counter() - start
        if i > first:  # the first step compiles
            seen, elapsed = seen + x.size, elapsed + took
        record = {
            "step": i + 1, "loss": loss, "lr": args.lr * training_options.lr_factor(args, i),
            "tokens_per_s": x.size / took, "sample": loader.position,
        }  # fmt: skip
        if args.eval_every and ((i + 1) % args.eval_every == 0 or i + 1 == args.steps):
            params = step.gather(state).params
            record["val_loss"] = evaluate(loss_fn, params, val, args.batch, args.eval_batches)
        records.append(record)
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        bar.update(1)
        if args.log_every and ((i + 1) % args.log_every == 0 or i + 1 == args.steps):
            val_text = f"  val {record['val_loss']:.4f}" if "val_loss" in record else ""
            say(f"step {i + 1}  loss {loss:.4f}  lr {record['lr']:.2e}  "
                f"{record['tokens_per_s']:.0f} tokens/s{val_text}")  # fmt: skip
        if manager is not None and manager.due(state.step) and i + 1 < args.steps:
            manager.save(step, state, extra={"data": loader.state_dict()})
        stop = preemption.requested() if preemption is not None and i + 1 < args.steps else None
        if stop is not None and manager is not None:  # the ranks agree: save and stop
            where = manager.save(step, state, extra={"data": loader.state_dict()})
            manager.wait()
            preemption.saved()  # type: ignore[union-attr]
            say(f"preempted by {stop.name} after step {state.step}: saved {where} "
                f"(run again with --save {args.save} to resume)")  # fmt: skip
            bar.close()
            if log:
                log.close()
            return {
                "record": record,
                "tokens_per_s": float("nan"),
                "sample": "",
                "records": records,
            }
        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{x.size / took:.0f}", **(
            {"val": f"{record['val_loss']:.3f}"} if "val_loss" in record else {}))  # fmt: skip
    bar.close()
    if log:
        log.close()
    if manager is not None and state.step > first:
        where = manager.save(step, state, extra={"data": loader.state_dict()})
        manager.wait()
        say(f"saved step {state.step} (sample {loader.position}) to {where}")
    speed = seen / elapsed if elapsed else float("nan")
    if record:
        val_text = f", val loss {record['val_loss']:.4f}" if "val_loss" in record else ""
        say(
            f"step {record['step']}: train loss {record['loss']:.4f}{val_text}, {speed:.0f} tokens/s"
        )
    if args.plot and records and RANK0:
        title = (f"Llama {args.layers} layers x {args.dim}, {tokenizer.name} tokens, "
                 f"batch {args.batch} x {args.seq}, lr {args.lr}")  # fmt: skip
        plot(records, args.plot, title)
        say(f"wrote {args.plot}")
    text = ""
    if args.sample > 0:
        prompt = tokenizer.encode(args.prompt)
        ids, rate = sample(
            model, step.gather(state).params, prompt, args.sample, args.temperature, args.seed
        )
        text = tokenizer.decode(ids)
        how = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}"
        say(f"--- sample ({how}, {rate:.0f} tokens/s with the KV cache) ---")
        say(text)
    return {"record": record, "tokens_per_s": speed, "sample": text, "records": records}


if __name__ == "__main__":
    main()
