"""Offline bundles for hosts without a network (`timeshare bundle`): wheels of
timeshare[server,cuda] and its dependencies for one Python and platform, the
Temporal CLI inside its wheel, install.sh and manifest.json. Needs pip, never
temporalio."""

from timeshare.bundle.errors import BundleError
from timeshare.bundle.make import BundleOptions, make_bundle
from timeshare.bundle.manifest import Manifest

__all__ = ["BundleError", "BundleOptions", "Manifest", "make_bundle"]
