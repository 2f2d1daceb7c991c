"""Pure policy-optimisation functions of tensors: advantages, losses, KL, DynaMO modulation.

Everything here is a function of tensors and masks (no config objects, services or distributed
state) and imports only torch. Shapes: ``B`` responses, ``T`` response tokens, ``mask`` a {0, 1}
float/bool ``[B, T]``. The learner picks variants by name from ``ADVANTAGE_ESTIMATORS`` and
``POLICY_LOSSES`` (and the mismatch correction from ``IS_CORRECTIONS``), whose entries share one signature each (see ``registry``). Formulas are in each
function's docstring and in ``docs/algorithms.md``.
"""

from learner.algorithms.advantages import (
    dapo_keep_groups,
    discounted_returns,
    drgrpo_advantages,
    gae_advantages,
    group_index,
    grpo_advantages,
    masked_mean,
    masked_whiten,
    opd_advantages,
    outcome_token_rewards,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
)
from learner.algorithms.dynamo import DYNAMO_PRESETS, DynamoParams, dynamo_modulate, dynamo_params
from learner.algorithms.logits import (
    entropy_from_logits,
    token_logprobs,
    token_logprobs_and_entropy,
)
from learner.algorithms.losses import (
    AGG_MODES,
    DPO_KINDS,
    KL_KINDS,
    aggregate_loss,
    dpo_loss,
    geometric_masked_is,
    geometric_truncated_is,
    group_token_counts,
    gspo_loss,
    kl_penalty,
    policy_loss,
    sequence_masked_is,
    sequence_truncated_is,
    token_masked_is,
    token_truncated_is,
    value_loss,
)
from learner.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    IS_CORRECTIONS,
    POLICY_LOSSES,
    AdvantageEstimator,
    ISCorrection,
    ISWeights,
    PolicyLoss,
    Registry,
    UnknownNameError,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "DPO_KINDS",
    "DYNAMO_PRESETS",
    "IS_CORRECTIONS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "AdvantageEstimator",
    "DynamoParams",
    "ISCorrection",
    "ISWeights",
    "PolicyLoss",
    "Registry",
    "UnknownNameError",
    "aggregate_loss",
    "dapo_keep_groups",
    "discounted_returns",
    "dpo_loss",
    "drgrpo_advantages",
    "dynamo_modulate",
    "dynamo_params",
    "entropy_from_logits",
    "gae_advantages",
    "geometric_masked_is",
    "geometric_truncated_is",
    "group_index",
    "group_token_counts",
    "grpo_advantages",
    "gspo_loss",
    "kl_penalty",
    "masked_mean",
    "masked_whiten",
    "opd_advantages",
    "outcome_token_rewards",
    "overlong_penalty",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sequence_masked_is",
    "sequence_truncated_is",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "token_masked_is",
    "token_truncated_is",
    "value_loss",
]
