"""Development tools that are not part of the installed packages (run from a checkout of this repository)."""
