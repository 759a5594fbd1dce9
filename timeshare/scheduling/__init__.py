"""The scheduling core: how a group of jobs takes turns on its GPUs, as plain
data in and decisions out.

Nothing here imports Temporal or does I/O; time is always passed in.
GroupWorkflow (workflows/group.py) turns its messages and timers into events
for GroupCore.handle and carries out the commands it returns, so every
scheduling rule lives here and is tested here. The placement advisor drives it
through the same door.

Rules:
- at most one job holds the turn; the turn is named by a growing epoch;
- grants follow arrival order (tickets), with two documented exceptions: a
  waiter that needs a drained node is passed over (it keeps its place), and a
  paused group grants nothing;
- a job is granted only after every other job's state has left every node it
  needs: the planned switch evicts the resident job and admits the next one,
  and the grant happens only when every node has reported;
- a job leaves as a whole: when the next job needs one of its nodes, it
  leaves every node it is resident on (drained nodes excepted), and where it
  leaves more than one, it is stopped on all of them before its state is
  checkpointed on any (the ranks of one job talk to each other; none may run
  on while another's state is gone);
- when the next job is already resident everywhere it runs, the grant is
  immediate and no node is touched (the lazy, "deferred snapshot" path);
- while nobody holds or waits, the job expected to ask first may be brought
  onto its nodes ahead of its request (prefetch), so that its request is
  granted at once; nobody is granted when that switch ends;
- every joined job holds a lease renewed by its messages; a job whose lease
  runs out is evicted, its turn (if any) passes on, and its next call is told
  why;
- with a turn limit, a holder that others wait for is asked to yield, and
  after a grace period is preempted: its state is checkpointed (the job does
  not notice) and it waits at the back of the queue to resume its turn;
- a backfill job is granted only while no regular job holds or waits; a
  regular job that asks asks the backfill holder to yield at once, and
  preempts it after the group's backfill grace (backfill.py);
- in groups created with rules 4, a backfill job is granted into a gap only
  when the gap the regular jobs' asks predict is longer than its switches
  there and back, and a turn is held open for a yielder no longer than a
  switch would take (switch_costs.py);
- an event the core refuses, or fails on, leaves the state as it was: each
  is handled on a draft that is kept only once the handler returns (draft.py).
"""
