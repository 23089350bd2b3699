"""One module per CLI command; `diagsafe_local.cli` assembles them."""
