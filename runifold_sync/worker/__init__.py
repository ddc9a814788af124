"""One worker process: its loop, the execution of each claimed task, and the background
thread that keeps its leases."""
