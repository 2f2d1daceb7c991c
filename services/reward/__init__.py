"""The reward service: math verification and sandboxed code execution over HTTP."""
