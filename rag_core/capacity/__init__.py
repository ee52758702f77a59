"""Capacity planning: what a rebuild of a dump will take (disk, RAM per worker, hours) before it runs."""
