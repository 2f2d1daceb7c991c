"""Cost of DynaMO modulation and entropy on the loss head, against the plain clipped loss.

The loss head is everything after the model's logits: token log-probabilities, the PPO clipped
loss, and its backward pass down to the logits. On B=8, T=1024, V=32k float32 logits (1 GiB;
another 1 GiB for their gradient) it times:

- plain:   ``token_logprobs`` -> ``policy_loss`` -> backward (the baseline);
- dynamo:  ``token_logprobs_and_entropy`` -> ``dynamo_modulate`` -> ``policy_loss`` -> backward;
- the pieces: ``dynamo_modulate`` alone on [B, T] tensors, and one read-only pass over the logits
  (``amax`` over the vocabulary) as the unit for "one extra pass";
- with ``--naive``, the textbook head (``log_softmax`` + ``gather``, autograd keeping the
  [B, T, V] result) for reference — it needs about 2 GiB more memory.

Targets (issue 3): modulation under 5% of the plain forward+backward; entropy no more than one
extra pass over the logits. Prints each figure (best of ``--repeats``) and the ratios.

    .venv/bin/python benchmarks/bench_algorithms.py [--batch 8 --seq 1024 --vocab 32768]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from learner.algorithms import (
    dynamo_modulate,
    policy_loss,
    token_logprobs,
    token_logprobs_and_entropy,
)


def timed(
    fns: dict[str, Callable[[], object]], repeats: int, device: torch.device
) -> dict[str, tuple[float, float]]:
    """Best (minimum) process CPU time and wall time of each function, in seconds.

    The functions run round-robin (after one warm-up call each), so a burst of load from the
    neighbours hits all variants alike instead of one. The minimum, not the mean: the slow runs
    measure the neighbours. CPU time (``time.process_time``) leaves out the time this process
    waits for a core, so on a busy machine it is the steadier figure; with one thread on an idle
    machine the two agree.
    """

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    cpu: dict[str, list[float]] = {name: [] for name in fns}
    wall: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    sync()
    for _ in range(repeats):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            sync()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {name: (min(cpu[name]), min(wall[name])) for name in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--naive", action="store_true", help="also time the log_softmax head")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    b, t, v = args.batch, args.seq, args.vocab
    gen = torch.Generator(device="cpu").manual_seed(0)

    logits = (torch.randn(b, t, v, generator=gen) * 2).to(device).requires_grad_()
    tokens = torch.randint(0, v, (b, t), generator=gen).to(device)
    lengths = torch.randint(t // 2, t + 1, (b,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).float().to(device)
    with torch.no_grad():
        cur = token_logprobs(logits, tokens)
    old = (cur + torch.randn(b, t, generator=gen).to(device) * 0.1).detach()
    adv = torch.randn(b, t, generator=gen).to(device)
    clip = {"clip_low": 0.2, "clip_high": 0.28}

    def plain() -> None:
        logits.grad = None
        logp = token_logprobs(logits, tokens)
        loss, _ = policy_loss(logp, old, adv, mask, dual_clip=10.0, **clip)
        loss.backward()

    def with_dynamo() -> None:
        logits.grad = None
        logp, entropy = token_logprobs_and_entropy(logits, tokens)
        a, _ = dynamo_modulate(adv, logp.detach(), old, entropy.detach(), mask, **clip)
        loss, _ = policy_loss(logp, old, a, mask, dual_clip=10.0, **clip)
        loss.backward()

    def with_entropy_only() -> None:
        logits.grad = None
        logp, _entropy = token_logprobs_and_entropy(logits, tokens)
        loss, _ = policy_loss(logp, old, adv, mask, dual_clip=10.0, **clip)
        loss.backward()

    with torch.no_grad():
        lp0, ent0 = token_logprobs_and_entropy(logits, tokens)

    def modulation() -> None:
        dynamo_modulate(adv, lp0, old, ent0, mask, **clip)

    def one_pass() -> None:
        with torch.no_grad():
            logits.amax(-1)

    def lse_pass() -> None:
        with torch.no_grad():
            token_logprobs(logits, tokens)

    def naive() -> None:
        logits.grad = None
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
        loss, _ = policy_loss(logp, old, adv, mask, dual_clip=10.0, **clip)
        loss.backward()

    r = args.repeats
    gib = logits.numel() * logits.element_size() / 2**30
    print(
        f"loss head on B={b} T={t} V={v} {logits.dtype} ({gib:.2f} GiB of logits), "
        f"device={device}, threads={torch.get_num_threads()}, best of {r}"
    )
    print(f"  {'':40s} {'cpu ms':>9s} {'wall ms':>9s}  ratio (cpu, wall)")
    fns = {"plain": plain, "ent": with_entropy_only, "dyn": with_dynamo, "read": one_pass}
    fns["lse"] = lse_pass
    if args.naive:
        fns["naive"] = naive
    figs = timed(fns, r, device)
    figs["mod"] = timed({"mod": modulation}, max(r, 20), device)["mod"]
    base = figs["plain"]

    def line(label: str, fig: tuple[float, float], note: str = "") -> None:
        ratios = f"{fig[0] / base[0]:.3f}, {fig[1] / base[1]:.3f}"
        print(f"  {label:40s} {fig[0] * 1e3:9.1f} {fig[1] * 1e3:9.1f}  {ratios}  {note}")

    ent, dyn, mod, read, lse = (figs[k] for k in ("ent", "dyn", "mod", "read", "lse"))
    line("plain clipped loss, fwd+bwd", base, "(baseline)")
    line("+ entropy (fused), fwd+bwd", ent)
    line("+ entropy + dynamo_modulate, fwd+bwd", dyn)
    line("dynamo_modulate alone ([B, T] inputs)", mod, "(target < 0.05)")
    line("one read pass over the logits (amax)", read)
    line("one softmax-normaliser pass (lse)", lse)
    for i, unit in ((0, "cpu"), (1, "wall")):
        extra = ent[i] - base[i]
        print(
            f"  entropy's extra cost ({unit}): {extra * 1e3:.1f} ms = {extra / read[i]:.2f} read "
            f"passes = {extra / lse[i]:.2f} lse passes (target <= 1 pass); modulation = "
            f"{100 * mod[i] / base[i]:.3f}% of plain (target < 5%)"
        )
    if args.naive:
        line("naive log_softmax head, fwd+bwd", figs["naive"])


if __name__ == "__main__":
    main()
