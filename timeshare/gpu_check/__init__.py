"""`timeshare gpu-check`: proves a new GPU host in one command (main.py),
with the GPU emulator (emulator/) for hosts without a GPU."""
