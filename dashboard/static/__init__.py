"""Static files of the built-in dashboard (a package so that wheels carry them)."""
