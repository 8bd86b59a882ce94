"""Executors on several hosts: network namespaces on a test network of our own."""
