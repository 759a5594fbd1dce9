"""RL frameworks take turns through timeshare without a fork: one module per
framework (``trl``, ``verl``, ``slime``, ``openrlhf``, ``skyrl``), each
importing its framework only when used, each bracketing the framework's GPU
phases at the framework's own extension points.

All of them take their turns through a `Turns` (timeshare.integrations.turns),
chosen by the environment (timeshare.integrations.environment.turns_from_env):

- ``TIMESHARE_TURNS_FD`` set: the process was started under a coordinator
  (``python -m timeshare.integrations.coordinator``), which holds the job's
  place in the group and asks for the turns; this process only uses the GPU.
  The one layout that works when the node's backend stops whole processes
  between turns (``freeze``, ``freeze+cuda``).
- ``TIMESHARE_GROUP`` and ``TIMESHARE_JOB`` set: this process joins the group
  itself and asks for its own turns (``cuda``, ``cuda-checkpoint``,
  ``app+cuda``: backends that leave the process running on the CPU).
- neither: every call is a no-op and the framework runs as it would without
  timeshare.

See docs/integrations.md for each framework's lines to add.
"""
