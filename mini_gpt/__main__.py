"""`python -m mini_gpt`: train a preset on the shipped corpus on CPU and show a greedy sample."""

import argparse
import time

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mini_gpt.batches import BatchSampler, corpus_tokens
from mini_gpt.config import PRESETS, preset
from mini_gpt.model import GPT
from mini_gpt.tokenizer import default_tokenizer
from mini_gpt.train import fit, make_optimizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mini_gpt", description=__doc__)
    parser.add_argument("--preset", choices=list(PRESETS), default="tiny")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=6e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    # One thread by default: these matmuls are tiny, and extra threads stall on a busy small machine.
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--prompt", default="la niña ", help="start of the greedy sample")
    parser.add_argument("--sample-length", type=int, default=120, help="characters to generate")
    args = parser.parse_args(argv)
    try:
        args.prompt_ids = default_tokenizer().encode(args.prompt)
    except ValueError as e:
        parser.error(f"--prompt: {e}")
    if not args.prompt_ids:
        parser.error("--prompt must not be empty")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    console = Console()
    config = preset(args.preset)
    model = GPT(config, seed=args.seed)
    sampler = BatchSampler(corpus_tokens(), config.block_size, args.batch_size, seed=args.seed)
    console.print(f"MiniGPT-{args.preset}: {model.num_parameters():,} parameters, {config}")

    columns = (
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
    )
    start = time.perf_counter()
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=args.steps, loss=float("nan"))
        losses = fit(
            model,
            make_optimizer(model, args.lr),
            sampler,
            args.steps,
            on_step=lambda _, loss: progress.update(task, advance=1, loss=loss),
        )
    elapsed = time.perf_counter() - start

    if losses:
        tail = losses[-10:]
        console.print(
            f"loss: first {losses[0]:.3f}, last {losses[-1]:.3f} "
            f"(mean of last {len(tail)}: {sum(tail) / len(tail):.3f}) "
            f"in {elapsed:.1f}s ({1000 * elapsed / len(losses):.0f} ms/step)"
        )
    model.eval()
    prompt = torch.tensor([args.prompt_ids])
    sample = default_tokenizer().decode(model.generate(prompt, args.sample_length)[0].tolist())
    console.print("greedy sample:")
    console.print(sample, markup=False, highlight=False)


if __name__ == "__main__":
    main()
