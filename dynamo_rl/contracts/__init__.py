"""Wire contracts between the processes: one module per contract, imported by both ends."""
