"""Cost models: plain functions from sizes and hardware to seconds. They know nothing of simpy."""
