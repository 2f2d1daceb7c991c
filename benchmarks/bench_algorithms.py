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


def timed(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Best (minimum) wall time of ``fn`` in seconds, after one warm-up call.

    The minimum, not the mean: on a shared machine the slow runs measure the neighbours.
    """

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


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
    t_plain = timed(plain, r, device)
    t_ent = timed(with_entropy_only, r, device)
    t_dyn = timed(with_dynamo, r, device)
    t_mod = timed(modulation, max(r, 20), device)
    t_pass = timed(one_pass, r, device)
    print(f"  plain clipped loss, fwd+bwd           {t_plain * 1e3:9.1f} ms   (baseline)")
    print(
        f"  + entropy (fused), fwd+bwd            {t_ent * 1e3:9.1f} ms   ratio {t_ent / t_plain:.3f}"
    )
    print(
        f"  + entropy + dynamo_modulate, fwd+bwd  {t_dyn * 1e3:9.1f} ms   ratio {t_dyn / t_plain:.3f}"
    )
    print(
        f"  dynamo_modulate alone ([B, T])        {t_mod * 1e3:9.2f} ms   "
        f"{100 * t_mod / t_plain:.2f}% of plain (target < 5%)"
    )
    print(f"  one read pass over the logits (amax)  {t_pass * 1e3:9.1f} ms")
    print(
        f"  entropy's extra cost                  {(t_ent - t_plain) * 1e3:9.1f} ms   "
        f"{(t_ent - t_plain) / t_pass:.2f} passes (target <= 1)"
    )
    if args.naive:
        t_naive = timed(naive, r, device)
        print(
            f"  naive log_softmax head, fwd+bwd       {t_naive * 1e3:9.1f} ms   "
            f"plain is {t_naive / t_plain:.2f}x faster"
        )


if __name__ == "__main__":
    main()
