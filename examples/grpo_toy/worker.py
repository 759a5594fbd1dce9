"""The GPU worker of a toy GRPO job: it holds the policy (its "device
state") and runs the sampler and trainer phases on command. It registers
with the node agent, so the freeze backend stops it whenever another job
holds the GPUs. Commands: one JSON object per line on stdin."""

from __future__ import annotations

import json
import sys

from examples.grpo_toy import policy
from timeshare.registration import register_process


def main() -> None:
    seed, group, job = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    pid = register_process(group, job) if group else 0
    print(json.dumps({"registered": pid}), flush=True)
    weights = policy.initial_weights(seed)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "sample":
            prompts, answers = policy.sample(weights, seed, command["step"])
            reply = {"prompts": prompts, "answers": answers}
        elif command["op"] == "train":
            weights = policy.train(
                weights, command["prompts"], command["answers"], command["rewards"]
            )
            reply = {}
        else:
            reply = {"fingerprint": policy.fingerprint(weights)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
