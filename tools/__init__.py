"""Development tooling that is not part of the installed ds4deploy package (run from the repository root)."""
