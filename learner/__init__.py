"""The learner: FSDP2 training on the trajectory stream, checkpoints and weight push."""
