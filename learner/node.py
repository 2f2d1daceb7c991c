"""``python -m learner.node <torchrun arguments>``: one node of a multi-node learner — torchrun,
run in this process, that names the node missing when the rendezvous times out.

The learner Job (deploy/k8s/base/learner.yaml) runs it on every pod. It is torchrun's own entry
point (``torch.distributed.run.main``) with the same arguments, exit codes and output; the one
difference is the static rendezvous failing at its timeout, where torch says only
``1/2 clients joined`` (on node 0) or the address it could not reach (on the other nodes). Then,
after torch's error, one line names what is missing (:func:`missing_nodes`): on node 0 the node
ranks that never came when node 0 was alone (else how many, as torch does not say which), on
another node node 0 and its address. The exit code stays torch's (1, an uncaught error); any other
error, or a message this does not recognise, is torch's, unchanged.
"""

from __future__ import annotations

import re
import sys
import traceback
from argparse import Namespace
from collections.abc import Sequence

# torch's words (c10d TCPStore), on the node hosting the store and on the others.
_SERVER = re.compile(r"waiting for clients\. (\d+)/(\d+) clients joined")
_CLIENT = re.compile(r"timed out after (\d+)ms while trying to connect to \((.+), (\d+)\)")


def _timeout(rdzv_conf: str) -> str:
    """The rendezvous timeout as the command sets it, for the message."""
    for item in rdzv_conf.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "timeout" and value.strip():
            return f"{value.strip()} s (--rdzv-conf timeout)"
    return "the rendezvous timeout"


def missing_nodes(error: str, args: Namespace) -> str | None:
    """The line naming who never came, from torch's rendezvous error and torchrun's parsed
    arguments; None when the error is not a static rendezvous timing out."""
    if args.rdzv_backend != "static":
        return None
    rank = args.node_rank
    where = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}"
    within = _timeout(args.rdzv_conf)
    m = _SERVER.search(error)
    if m is not None and rank == 0:
        joined, nodes = int(m.group(1)), int(m.group(2))
        if not 0 < joined < nodes:
            return None
        if joined == 1:  # only this node came: every other one is missing
            ranks = ", ".join(str(r) for r in range(1, nodes))
            who = f"node rank(s) {ranks} of {nodes} never joined"
        else:
            missing = nodes - joined
            who = f"{missing} of {nodes} nodes never joined ({joined} did; torch says not which)"
        return (
            f"learner node rank 0: {who} the rendezvous at {where} within {within}; "
            "check that each missing node's pod or host runs this command with its --node-rank"
        )
    m = _CLIENT.search(error)
    if m is not None and rank > 0:
        return (
            f"learner node rank {rank}: node rank 0 never answered at {m.group(2)}:{m.group(3)} "
            f"(--master-addr, --master-port) within {within}; check that node 0's pod or host "
            "runs this command and that the address resolves and the port is reachable"
        )
    return None


def main(argv: Sequence[str] | None = None) -> None:
    from torch.distributed import DistError, run

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        run.main(argv)
    except DistError as e:
        line = missing_nodes(str(e), run.parse_args(argv))
        if line is None:
            raise
        traceback.print_exc()  # torch's error, as torchrun prints it
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)  # what an uncaught error exits with, as under torchrun


if __name__ == "__main__":
    main()
