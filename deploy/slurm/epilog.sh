#!/bin/bash
# Slurm Epilog for timeshare (slurm.conf: Epilog=/etc/slurm/timeshare-epilog.sh).
#
# Slurm runs it as root on every node of a job after the job ended and its
# processes were killed. The agent drops registered processes by itself once
# they exit (its socket has no request to forget them), and the scheduler
# drops a job whose processes are all gone at the next switch on its nodes.
# What would remain is the job's place in its group until its lease runs out
# (for a job that held no turn, idle_lease_seconds: an hour by default), so
# this evicts the job, by the name the TaskProlog gave it (slurm-<job id>),
# from whichever group holds it. Every node of a job does so; eviction is
# idempotent.
#
# It always exits 0: a failing Epilog sets the node DOWN, and a timeshare
# outage must not take Slurm's nodes with it (the lease ends the job's place
# in its group anyway).
set -u
# Slurm gives prolog and epilog scripts no search path.
PATH=/usr/sbin:/usr/bin:/sbin:/bin

settings=${TIMESHARE_SLURM_ENV:-/etc/timeshare/slurm.env}
if [[ -r "${settings}" ]]; then
    set -a
    # shellcheck source=/dev/null
    . "${settings}"
    set +a
fi
python_bin=${TIMESHARE_PYTHON:-/opt/timeshare/bin/python}

[[ -n "${SLURM_JOB_ID:-}" ]] || exit 0
job="slurm-${SLURM_JOB_ID}"

output=$(timeout 30 "${python_bin}" - "${job}" "Slurm job ${SLURM_JOB_ID} ended" 2>&1 <<'PYTHON'
import sys

import timeshare

job, reason = sys.argv[1], sys.argv[2]
try:
    with timeshare.connect() as client:  # TIMESHARE_ADDRESS
        for group in client.list_groups():
            if any(entry.job == job for entry in group.jobs):
                client.evict(group.group, job, reason)
                print(f"evicted {job} from group {group.group}")
except timeshare.TimeshareError as error:
    sys.exit(f"{type(error).__name__}: {error}")
PYTHON
)
status=$?
if [[ ${status} -ne 0 ]]; then
    logger -t timeshare-epilog -- "could not evict ${job} (exit ${status}): ${output}" || true
elif [[ -n "${output}" ]]; then
    logger -t timeshare-epilog -- "${output}" || true
fi
exit 0
