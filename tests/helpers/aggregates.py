"""Aggregate functions of the window tests: ``CountSum``, (count, sum) of the values a window got."""

from __future__ import annotations


class CountSum:
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + 1, acc[1] + value)

    def get_result(self, acc):
        return acc

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])
