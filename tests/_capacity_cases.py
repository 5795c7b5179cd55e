"""Channel capacities that are not a count of micro-batches, and what the refusal says of each:
Flow(channel_capacity=...) and simulate(channel_capacity=...) refuse the same values alike."""

BAD_CAPACITIES = [
    (-1, "cannot be negative"),
    (1.5, "whole number of micro-batches"),
    ("2", "whole number of micro-batches"),
    (True, "whole number of micro-batches"),
]
