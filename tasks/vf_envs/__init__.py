"""verifiers environments of this repository's recipes (``configs/verifiers_multi_turn.yaml``),
each a module with ``load_environment(**args)`` in the library's own API, over data generated
locally."""
