"""The placement advisor: which jobs should share which GPUs.

Profiles (written by hand or measured from a group's history) feed a
discrete-event model that drives the scheduler's own pure core (through
GroupCore.handle, as the group workflow does) in virtual time; a search
partitions jobs into groups with it. Client-side only: nothing here imports
temporalio.
"""
