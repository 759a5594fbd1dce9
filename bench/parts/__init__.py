"""What the benchmarks are built from, none of them a benchmark: shared
measurements (floors, CPU from /proc, Temporal's counters, history counts,
profiles), the loads they run, and the child processes they start (chaos
jobs, CUDA ranks, GPU holders, the floor's worker)."""
