"""Measurements that are not timings: how often guesses would be right, and why."""
