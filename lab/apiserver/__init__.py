"""lab/apiserver."""
