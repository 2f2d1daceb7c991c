"""One module per wire contract between the processes: both ends of a contract import it, so
neither can drift from the other (``stream``: rollout workers → Redis stream → learner)."""
