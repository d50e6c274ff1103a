"""A conductor's calls over RabbitMQ, with the RPC client of whichever
version runs this file: an earlier one in its own virtualenv (its
agent/rpcapi.py or agent/rpc/client.py), or this checkout
(compute_agent/rpc/client.py, PYTHONPATH set).

Reads {"config": path, "host": name, "steps": [[method, {argument: value}],
...]} on stdin; prints {"results": ["ok" or the error's class name, ...],
"answers": [what each call answered, or the error's text]}. A method this
client does not have answers "unknown"; an argument its method does not
take is left out (an older client's live_migrate takes no destination).
"""
from __future__ import annotations

import inspect
import json
import sys

try:
    from compute_agent.cmd.common import load_config
    from compute_agent.exception import AgentError
    from compute_agent.rpc.client import ComputeAgentAPI
except ImportError:  # before the one namespace: agent
    from agent.cmd.common import load_config
    from agent.exception import AgentError
    try:
        from agent.rpc.client import ComputeAgentAPI
    except ImportError:  # before the rpc package: one module
        from agent.rpcapi import ComputeAgentAPI


def error_name(error: Exception) -> str:
    """The declared error's class, as oslo.messaging rebuilt it: one of
    this client's own errors, whichever version's agent sent it (else its
    class name marked as not rebuilt)."""
    name = type(error).__name__.removesuffix("_Remote")
    return name if isinstance(error, AgentError) else f"not rebuilt: {name}"


def main() -> None:
    request = json.load(sys.stdin)
    api = ComputeAgentAPI(load_config(["--config-file", request["config"]]), timeout=60)
    results, answers = [], []
    try:
        for method, arguments in request["steps"]:
            call = getattr(api, method, None)
            if call is None:
                results.append("unknown")
                answers.append(None)
                continue
            takes = inspect.signature(call).parameters
            try:
                answers.append(call(request["host"], **{k: v for k, v in arguments.items()
                                                        if k in takes}))
                results.append("ok")
            except Exception as e:  # the caller judges which error was due
                results.append(error_name(e))
                answers.append(str(e).splitlines()[0] if str(e) else "")
    finally:
        api.close()
    print(json.dumps({"results": results, "answers": answers}, default=str))


if __name__ == "__main__":
    main()
