"""Pure policy-optimisation functions of tensors: advantages, losses, KL, DynaMO modulation."""
