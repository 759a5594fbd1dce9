"""Two TRL GRPO jobs taking turns through timeshare's TRL integration."""
