"""Benchmarks that print comparable figures: `python -m bench NAME [ARGS...]`,
and `python -m bench --list` for what each measures. Each module at this
level is one benchmark; what they are built from lies in bench.parts."""
