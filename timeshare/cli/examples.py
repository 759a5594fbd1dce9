"""An example for each subcommand, shown at the end of its help. The suite
parses every one of them with the command's own parser (tests/unit/test_cli_help.py),
so an example cannot name a flag the command lost."""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "temporal": [
        "timeshare temporal --data-dir /var/lib/timeshare --port 7233 --ui-port 8233",
    ],
    "scheduler": [
        "timeshare scheduler --temporal temporal.example.org:7233 --namespace rl",
    ],
    "gateway": [
        "timeshare gateway  # loopback only: 127.0.0.1:50051",
        "timeshare gateway --listen 0.0.0.0:50051 --tls-cert server.pem --tls-key server.key"
        " --tokens-file tokens.toml",
    ],
    "agent": [
        "timeshare agent --node gpu-7 --backend cuda",
        "timeshare agent --node gpu-7 --backend app+cuda  # hooks first, then the driver",
        "timeshare agent --probe  # list this host's GPUs and exit",
    ],
    "up": [
        "timeshare up  # a simulated GPU: runs on any laptop",
        "timeshare up --backend cuda  # a GPU host",
    ],
    "demo": [
        "timeshare demo",
        "timeshare demo --iterations 3",
    ],
    "status": [
        "timeshare status",
        "timeshare status --group grpo-pair -o wide",
        "timeshare status -o json --watch 5",
    ],
    "pause": ["timeshare pause --group grpo-pair"],
    "resume": ["timeshare resume --group grpo-pair"],
    "evict": ["timeshare evict --group grpo-pair --job job-b --reason 'restarting with new data'"],
    "drain": ["timeshare drain --node gpu-7"],
    "undrain": ["timeshare undrain --node gpu-7"],
    "report": ["timeshare report --group grpo-pair --out timeline.html"],
    "register": [
        "TIMESHARE_JOB_TOKEN=... timeshare register --group grpo-pair --job job-a --pid 4242"
    ],
    "llmd-token": ["TIMESHARE_LLMD_SECRET=... timeshare llmd-token --group trainers --job slime-1"],
    "forget": ["timeshare forget --group grpo-pair --job job-a"],
    "synthetic-job": [
        "timeshare synthetic-job --group try --job a --iterations 3",
    ],
    "profile": ["timeshare profile --group grpo-pair --json"],
    "plan": [
        "timeshare plan examples/placement/jobs.yaml --out plan.json",
        "timeshare plan --from-groups",
    ],
    "bundle": [
        "timeshare bundle --out timeshare-bundle --python-version 3.12"
        " --platform manylinux_2_28_x86_64",
    ],
    "gpu-check": [
        "timeshare gpu-check",
        "timeshare gpu-check --emulator  # no GPU: the GPU emulator",
    ],
}


def example_lines(command: str) -> list[str]:
    return EXAMPLES.get(command, [])


def epilog(command: str) -> str | None:
    """The help's closing lines for ``command``: its examples, if it has any."""
    lines = example_lines(command)
    if not lines:
        return None
    return "\n".join(["examples:", *(f"  {line}" for line in lines)])
