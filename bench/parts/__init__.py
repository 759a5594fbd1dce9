"""What the benchmarks are built from, none of them a benchmark: shared
measurements (floors, CPU from /proc, Temporal's counters, history counts,
profiles), the loads and stacks they run, and the chaos run's jobs."""
