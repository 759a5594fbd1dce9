"""Offline bundles for hosts without a network (`timeshare bundle`): wheels of
timeshare[server,cuda] and its dependencies for one Python and platform, the
Temporal CLI inside its wheel, install.sh and manifest.json. Needs pip, never
temporalio.

Nothing is imported here: every `timeshare` command builds its parser from
platforms.py, and only `bundle` needs the rest (make.py)."""
