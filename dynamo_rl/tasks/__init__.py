"""Built-in tasks: small verifiable datasets generated locally (no download)."""
