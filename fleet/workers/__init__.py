"""What runs on a node: GPU discovery, the worker launcher, the sandboxed runner, the artifact cache, workloads."""
