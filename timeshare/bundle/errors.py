"""What goes wrong while a bundle is made."""


class BundleError(Exception):
    """A bundle cannot be made; the message says why and what to do next."""
