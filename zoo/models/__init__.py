"""One sub-package per paper. Each is imported only when its entry is used."""
