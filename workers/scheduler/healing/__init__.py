"""Groups that heal by themselves: a group whose workflow task keeps failing
(a history the scheduler's code cannot replay, or a bug that fails every
attempt) is noticed by the scheduler that runs it and started again from
the state it last completed (docs/reliability.md, "A group that cannot be
replayed")."""
