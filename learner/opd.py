"""On-policy distillation in the RL step (``learner.algorithm.opd``, ``docs/learner.md``).

The rollout's teacher stage (``rollout.teacher``) scores every sampled token under a teacher
model; the teacher's log-probs travel on the stream beside the sampling log-probs
(``Response.teacher_logprobs``) and land in :attr:`learner.batch.Sample.teacher_logprobs`. Here
they become the per-token advantage ``−(log π_student − log π_teacher)``
(:func:`learner.algorithms.opd_advantages`, the sampling log-prob standing for the student's),
mixed into the outcome estimator's advantages (:func:`mix_opd`), and the step record's
``opd_reverse_kl`` (:func:`opd_record`): the mean over trained tokens of
``log π_student − log π_teacher``, the per-token reverse KL(π_student ‖ π_teacher) estimated on
the student's own samples.
"""

from __future__ import annotations

import torch

from dynamo_rl.config.learner import OpdConfig
from learner import algorithms as A
from learner.batch import Sample, to_rows


def mix_opd(
    samples: list[Sample], mask: torch.Tensor, advantages: torch.Tensor, cfg: OpdConfig
) -> torch.Tensor:
    """``cfg.outcome_weight · advantages + cfg.weight · A_opd`` (``[B, T]``; ``mask`` the trained
    tokens). Every sample must carry its teacher log-probs: a ValueError names the first that
    does not (the rollout ran without ``rollout.teacher``)."""
    missing = [i for i, s in enumerate(samples) if s.teacher_logprobs is None]
    if missing:
        raise ValueError(
            f"learner.algorithm.opd.weight is {cfg.weight} but {len(missing)} of {len(samples)} "
            f"responses (first: row {missing[0]}) carry no teacher log-probs; set rollout.teacher"
        )
    t_len = mask.shape[1]
    sampling = to_rows([s.sampling_logprobs for s in samples], t_len)
    teacher = to_rows([s.teacher_logprobs or [] for s in samples], t_len)
    opd = A.opd_advantages(sampling, teacher, mask)
    return cfg.outcome_weight * advantages.to(opd.dtype) + cfg.weight * opd


def opd_record(samples: list[Sample]) -> dict[str, float]:
    """``{"opd_reverse_kl": mean over the trained tokens of log π_student − log π_teacher}``
    over the samples a teacher scored; empty when none was."""
    total, tokens = 0.0, 0.0
    for s in samples:
        if s.teacher_logprobs is None:
            continue
        for w, lp, tlp in zip(s.trained(), s.sampling_logprobs, s.teacher_logprobs, strict=True):
            total += w * (lp - tlp)
            tokens += w
    return {"opd_reverse_kl": total / tokens} if tokens else {}
