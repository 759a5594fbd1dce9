#!/bin/bash
# Slurm TaskProlog for timeshare (slurm.conf: TaskProlog=/etc/slurm/timeshare-prolog.sh).
#
# Slurm runs it as the job's user, in each task's environment, just before the
# task starts, and puts every "export NAME=value" it prints into that task's
# environment. For a task of a job that set TIMESHARE_GROUP it
#   - names the job slurm-<job id> unless the job set TIMESHARE_JOB (the
#     epilog finds the job by that name),
#   - sets TIMESHARE_NODES to the job's nodes unless the job set it,
#   - if the step asked for it with TIMESHARE_REGISTER_TASK=1, registers the
#     task's process (and so its children) with this node's agent, proving the
#     job with the job's token from TIMESHARE_JOB_TOKEN (the job joined first).
# A registration that fails fails the task: an unregistered GPU process would
# keep its state on the GPUs while another job's state is restored there.
set -uo pipefail

timeshare_bin=${TIMESHARE_BIN:-/opt/timeshare/bin/timeshare}
scontrol_bin=${SCONTROL_BIN:-scontrol}

[[ -n "${TIMESHARE_GROUP:-}" ]] || exit 0

job=${TIMESHARE_JOB:-slurm-${SLURM_JOB_ID}}
echo "export TIMESHARE_JOB=${job}"

if [[ -z "${TIMESHARE_NODES:-}" ]]; then
    if ! nodes=$("${scontrol_bin}" show hostnames "${SLURM_JOB_NODELIST}" | paste -sd, -); then
        echo "print timeshare: cannot expand the job's node list ${SLURM_JOB_NODELIST}"
        exit 1
    fi
    echo "export TIMESHARE_NODES=${nodes}"
fi

if [[ "${TIMESHARE_REGISTER_TASK:-0}" == 1 ]]; then
    if ! output=$("${timeshare_bin}" register --group "${TIMESHARE_GROUP}" --job "${job}" \
            --pid "${SLURM_TASK_PID}" 2>&1); then
        echo "print timeshare: task ${SLURM_TASK_PID} of ${job} not registered: ${output//$'\n'/ }"
        exit 1
    fi
fi
exit 0
